-- 0019: one name for one structure. The BM25 blocks of 0008 and 0014 were called
-- champion lists, impact-ordered blocks, term lists and BM25 blocks, and lived in
-- kb.term_tops; they are the term blocks, kb.term_blocks, from now on. The table, its
-- constraints and index, its policy, its rebuild function and its trigger take that name;
-- the rows are kept as they are. The idempotent layer (retrieval/sql/term_blocks.sql,
-- retrieval/sql/search_lexical.sql, retrieval/sql/corpus_stats_policies.sql), re-applied at the end of this
-- upgrade, creates the new functions, triggers and policy.
-- Dead SQL goes too: kb.query_terms and kb.search_terms were read by tests and benchmarks
-- only (the search uses kb.search_term_counts).
drop trigger if exists chunks_term_tops_insert on kb.chunks;
drop trigger if exists chunks_term_tops_update on kb.chunks;
drop trigger if exists chunks_term_tops_delete on kb.chunks;
drop function if exists kb.chunks_maintain_term_tops();
drop function if exists kb.refresh_term_tops(integer, integer, double precision, double precision);
drop policy if exists "Champion lists are visible to their tenant" on kb.term_tops;

alter table kb.term_tops rename to term_blocks;
-- the primary key's index is renamed with its constraint
do $$
declare
  c record;
begin
  for c in select conname from pg_catalog.pg_constraint
           where conrelid = 'kb.term_blocks'::regclass and conname like 'term\_tops\_%' loop
    execute format('alter table kb.term_blocks rename constraint %I to %I',
                   c.conname, 'term_blocks_' || substr(c.conname, length('term_tops_') + 1));
  end loop;
end
$$;
comment on table kb.term_blocks is
  'BM25 term blocks: per tenant and common term, its chunks by tf_part in levels (see sql/schema/0014_term_blocks.sql)';

drop function if exists kb.query_terms(text);
drop function if exists kb.search_terms(text);
