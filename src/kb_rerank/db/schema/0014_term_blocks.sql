-- 0014: the champion lists (kb.term_tops, 0008) become impact-ordered blocks.
-- Per tenant and common term, the chunks sorted by their BM25 tf_part, descending,
-- cut into levels of growing size (level 0: the old champion list; see
-- sql/functions/04_term_tops.sql), so that kb.search_lexical reads a term's postings best
-- first and stops once the unread bounds cannot beat its k-th score.
--
-- Invariant, per (tenant, term) and level L: every chunk of the tenant that contains `term`
-- and is in none of the rows of levels 0..L has tf_part <= the rows' `tail` at level L
-- (with the rows' k1, b and avglen; all rows of a level carry the same tail). Tails fall
-- with the level. A level is one row from the rebuild (part 0) and, between rebuilds, the
-- rows the insert/update trigger adds (parts 1, 2, ...: appending to a large array would
-- rewrite it on every write). `n` is cardinality(chunk_ids), so that the search can plan its
-- reads without detoasting the arrays.
-- Existing lists are kept as level 0 (their invariant is the old one).
alter table kb.term_tops add column level integer not null default 0 check (level >= 0);
alter table kb.term_tops add column part integer not null default 0 check (part >= 0);
alter table kb.term_tops add column n integer;
update kb.term_tops set n = cardinality(chunk_ids);
alter table kb.term_tops alter column n set not null;
alter table kb.term_tops drop constraint term_tops_pkey;
alter table kb.term_tops add primary key (tenant_id, term, level, part);
comment on table kb.term_tops is
  'BM25 impact-ordered blocks: per tenant and common term, its chunks by tf_part in levels (see sql/schema/0014_term_blocks.sql)';
