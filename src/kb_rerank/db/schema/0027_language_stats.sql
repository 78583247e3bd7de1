-- 0027 BM25 statistics per language: a query in its own language is weighed with the
-- statistics of that language's chunks (kb.search_lexical_ids), so a minority language in a
-- tenant of mostly English documents keeps the weights it has in a tenant of its own.
-- kb.corpus_language_stats: per tenant and language (a chunk's language: its
-- '@language xx' lexeme, kb.language_lexeme), the chunks and the total length of each
-- field; kb.term_language_stats: the document frequency of each lexeme among them. Kept
-- exact by the statistics triggers (retrieval/sql/corpus_stats.sql, the idempotent layer,
-- applied after this file); row-level security and grants: retrieval/sql/corpus_stats_policies.sql.
create table kb.corpus_language_stats (
  tenant_id      uuid not null,
  language       text not null,
  n_chunks       bigint not null,
  total_len      bigint not null,
  stem_total_len bigint not null,
  primary key (tenant_id, language)
);
create table kb.term_language_stats (
  tenant_id uuid not null,
  language  text not null,
  term      text not null,
  df        integer not null,
  primary key (tenant_id, language, term)
);
alter table kb.corpus_language_stats enable row level security;
alter table kb.corpus_language_stats force row level security;
alter table kb.term_language_stats enable row level security;
alter table kb.term_language_stats force row level security;

-- backfill: the chunks already stored, each counted in its language
insert into kb.corpus_language_stats (tenant_id, language, n_chunks, total_len, stem_total_len)
  select c.tenant_id, x.language, count(*), sum(c.doc_len), sum(c.stem_len)
  from kb.chunks c
  cross join lateral (select substr(l.lexeme, 11) as language
                      from unnest(tsvector_to_array(c.tsv)) as l(lexeme)
                      where l.lexeme like '@language %' limit 1) as x
  group by c.tenant_id, x.language;
insert into kb.term_language_stats (tenant_id, language, term, df)
  select c.tenant_id, x.language, l.lexeme, count(*)
  from kb.chunks c
  cross join lateral (select substr(l.lexeme, 11) as language
                      from unnest(tsvector_to_array(c.tsv)) as l(lexeme)
                      where l.lexeme like '@language %' limit 1) as x
  cross join lateral unnest(tsvector_to_array(c.tsv)) as l(lexeme)
  group by c.tenant_id, x.language, l.lexeme;
