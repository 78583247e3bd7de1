-- kb.search_lexical(query, k): BM25 over the caller's tenant, best chunk per document.
--
-- Why SECURITY DEFINER (owned by kb_search, which has BYPASSRLS): under RLS the planner may
-- not evaluate `tsv @@ tsquery` before the policy's tenant check, because @@ is not
-- leakproof, so a ranked full-text query run by cyberos_app ignores the GIN index
-- (measured on PostgreSQL 18: 26.7 ms through RLS against 0.4 ms here at 50k rows per
-- tenant). This function applies the same isolation itself: every table it reads is
-- filtered on kb.current_tenant(), the tenant of the caller's transaction, and with no
-- tenant set it returns no rows (tenant_id = NULL is never true). search_path is pinned.
--
-- Scoring (Robertson/Lucene BM25):
--   idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
--   score(d) = sum over query terms t in d of idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avglen))
-- with N, df and avglen taken from the caller's tenant only (kb.corpus_stats, kb.term_stats).
-- Documents are deduplicated by doc_id: each document contributes its best chunk.
create or replace function kb.search_lexical(
  query text,
  k integer default 20,
  k1 double precision default 1.2,
  b double precision default 0.75
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  score double precision,
  rank integer
)
language sql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, public
as $$
  with tenant as (
    select kb.current_tenant() as id
  ),
  corpus as (
    select cs.n_chunks::float8 as n, cs.total_len::float8 / greatest(cs.n_chunks, 1) as avglen
    from kb.corpus_stats cs
    where cs.tenant_id = (select id from tenant)
  ),
  terms as (
    select ts.term, ln(1 + (corpus.n - ts.df + 0.5) / (ts.df + 0.5)) as idf
    from unnest(kb.query_terms(query)) as q(term)
    join kb.term_stats ts on ts.tenant_id = (select id from tenant) and ts.term = q.term
    cross join corpus
    where ts.df > 0
  ),
  tsq as (
    select kb.terms_tsquery(array(select term from terms)) as q
  ),
  candidates as (
    -- (tenant_id, tsv) GIN index: both conditions are index conditions
    select c.chunk_id, c.doc_id, c.tsv, c.doc_len
    from kb.chunks c
    where c.tenant_id = (select id from tenant)
      and c.tsv @@ (select q from tsq)
  ),
  scored as (
    select cand.chunk_id, cand.doc_id,
           sum(t.idf * (x.tf * (k1 + 1))
               / (x.tf + k1 * (1 - b + b * cand.doc_len / (select avglen from corpus)))) as score
    from candidates cand
    cross join lateral (
      select u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 as tf
      from unnest(cand.tsv) as u
    ) as x
    join terms t on t.term = x.lexeme
    group by cand.chunk_id, cand.doc_id
  ),
  best_per_doc as (
    select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
    from scored s
    order by s.doc_id, s.score desc, s.chunk_id
  ),
  top as (
    select * from best_per_doc
    order by score desc, chunk_id
    limit greatest(least(k, 1000), 0)
  )
  select top.chunk_id, top.doc_id, d.title, left(c.content, 300), c.content, top.score,
         (row_number() over (order by top.score desc, top.chunk_id))::integer
  from top
  join kb.chunks c on c.chunk_id = top.chunk_id
  join kb.documents d on d.doc_id = top.doc_id
  order by top.score desc, top.chunk_id
$$;
alter function kb.search_lexical(text, integer, double precision, double precision) owner to kb_search;
comment on function kb.search_lexical(text, integer, double precision, double precision) is
  'BM25 top-k chunks (best chunk per document) for the tenant in auth.tenant_id; empty when unset';
