-- BM25 statistics per tenant (kb.term_stats: document frequency per lexeme, stemmed
-- lexemes included; kb.corpus_stats: chunk count and total length of each field: doc_len
-- for the exact field, stem_len for the stemmed one) and per tenant and language
-- (kb.term_language_stats, kb.corpus_language_stats: the same over the chunks of one
-- language), kept exact under insert, update and delete by statement-level triggers with
-- transition tables.
--
-- SECURITY DEFINER, owned by kb_stats (BYPASSRLS; SELECT on kb.chunks and write on the
-- statistics tables kb.term_stats, kb.corpus_stats, kb.term_language_stats,
-- kb.corpus_language_stats, kb.term_blocks only, nothing else): the
-- statistics are derived data that the app role may read (under RLS) but never write
-- directly. The rows written come from the transition tables of a statement that RLS has
-- already checked, so a tenant can only move its own statistics. search_path pinned with
-- pg_temp last (no temporary type or table can shadow one the body uses).
create or replace function kb.apply_stats_delta(rows kb.chunks[], sign integer)
returns void
language sql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
  insert into kb.corpus_stats as cs (tenant_id, n_chunks, total_len, stem_total_len)
  select r.tenant_id, sign * count(*), sign * sum(r.doc_len), sign * sum(r.stem_len)
  from unnest(rows) as r
  group by r.tenant_id
  order by r.tenant_id
  on conflict (tenant_id) do update
    set n_chunks = cs.n_chunks + excluded.n_chunks,
        total_len = cs.total_len + excluded.total_len,
        stem_total_len = cs.stem_total_len + excluded.stem_total_len;

  insert into kb.term_stats as ts (tenant_id, term, df)
  select r.tenant_id, l.lexeme, sign * count(*)
  from unnest(rows) as r
  cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)
  group by r.tenant_id, l.lexeme
  order by r.tenant_id, l.lexeme          -- fixed lock order: no deadlock between writers
  on conflict (tenant_id, term) do update
    set df = ts.df + excluded.df;

  delete from kb.term_stats ts
  using (select distinct r.tenant_id, l.lexeme
         from unnest(rows) as r
         cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)) as touched
  where sign < 0 and ts.tenant_id = touched.tenant_id and ts.term = touched.lexeme and ts.df <= 0;

  delete from kb.corpus_stats cs
  where sign < 0 and cs.n_chunks <= 0
    and cs.tenant_id in (select r.tenant_id from unnest(rows) as r);

  -- the same per language (migration 0027): a chunk counts in its language
  -- (kb.tsv_language); a chunk of no known language in none
  insert into kb.corpus_language_stats as cs (tenant_id, language, n_chunks, total_len, stem_total_len)
  select r.tenant_id, kb.tsv_language(r.tsv), sign * count(*), sign * sum(r.doc_len), sign * sum(r.stem_len)
  from unnest(rows) as r
  where kb.tsv_language(r.tsv) is not null
  group by 1, 2
  order by 1, 2
  on conflict (tenant_id, language) do update
    set n_chunks = cs.n_chunks + excluded.n_chunks,
        total_len = cs.total_len + excluded.total_len,
        stem_total_len = cs.stem_total_len + excluded.stem_total_len;

  insert into kb.term_language_stats as ts (tenant_id, language, term, df)
  select r.tenant_id, r.language, l.lexeme, sign * count(*)
  from (select r.tenant_id, r.tsv, kb.tsv_language(r.tsv) as language from unnest(rows) as r) as r
  cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)
  where r.language is not null
  group by 1, 2, 3
  order by 1, 2, 3                         -- fixed lock order, as above
  on conflict (tenant_id, language, term) do update
    set df = ts.df + excluded.df;

  delete from kb.term_language_stats ts
  using (select distinct r.tenant_id, r.language, l.lexeme
         from (select r.tenant_id, r.tsv, kb.tsv_language(r.tsv) as language from unnest(rows) as r) as r
         cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)
         where r.language is not null) as touched
  where sign < 0 and ts.tenant_id = touched.tenant_id and ts.language = touched.language
    and ts.term = touched.lexeme and ts.df <= 0;

  delete from kb.corpus_language_stats cs
  where sign < 0 and cs.n_chunks <= 0
    and cs.tenant_id in (select r.tenant_id from unnest(rows) as r);
$$;
revoke all on function kb.apply_stats_delta(kb.chunks[], integer) from public;

-- SECURITY DEFINER (owner kb_stats): the statement trigger that writes the statistics,
-- see above; it fires for whoever writes kb.chunks.
create or replace function kb.chunks_maintain_stats()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op in ('DELETE', 'UPDATE') then
    perform kb.apply_stats_delta(array(select o::kb.chunks from old_rows as o), -1);
  end if;
  if tg_op in ('INSERT', 'UPDATE') then
    perform kb.apply_stats_delta(array(select n::kb.chunks from new_rows as n), 1);
  end if;
  return null;
end
$$;

drop trigger if exists chunks_stats_insert on kb.chunks;
drop trigger if exists chunks_stats_update on kb.chunks;
drop trigger if exists chunks_stats_delete on kb.chunks;
create trigger chunks_stats_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_stats();
create trigger chunks_stats_update after update on kb.chunks
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.chunks_maintain_stats();
create trigger chunks_stats_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.chunks_maintain_stats();

alter function kb.apply_stats_delta(kb.chunks[], integer) owner to kb_stats;
alter function kb.chunks_maintain_stats() owner to kb_stats;
revoke all on function kb.chunks_maintain_stats() from public;
