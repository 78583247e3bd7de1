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
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, public
as $fn$
begin
  -- EXECUTE plans the statement with the caller's actual tenant and terms (a custom plan):
  -- with many tenants, a generic plan estimates every tenant at rows / n_distinct and, for
  -- a large tenant, may scan its rows through a btree on tenant_id with @@ as a filter
  -- instead of the (tenant_id, tsv) GIN index. $1 tenant, $2 query, $3 k, $4 k1, $5 b.
  return query execute $q$
  with tenant as (
    select $1 as id
  ),
  corpus as (
    select cs.n_chunks::float8 as n, cs.total_len::float8 / greatest(cs.n_chunks, 1) as avglen
    from kb.corpus_stats cs
    where cs.tenant_id = (select id from tenant)
  ),
  terms as materialized (
    select ts.term, ts.df, ln(1 + (corpus.n - ts.df + 0.5) / (ts.df + 0.5)) as idf,
           kb.terms_tsquery(array[ts.term]) as tq,
           -- only kb.code_tokens lexemes (which always contain one of _ . / : # -) can be
           -- stored without positions; every parser lexeme has positions
           ts.term ~ '[_./:#-]' as may_lack_positions
    from unnest(kb.query_terms($2)) as q(term)
    join kb.term_stats ts on ts.tenant_id = (select id from tenant) and ts.term = q.term
    cross join corpus
    where ts.df > 0
  ),
  -- Top-k pruning (MaxScore), exact: the rarest terms, while their postings add up to
  -- fewer than 1000, are "essential"; the others are common. A chunk that matches common
  -- terms only scores at most sum(idf * (k1 + 1)) over the common terms (each BM25 term is
  -- below idf * (k1 + 1) when k1 >= 0 and 0 <= b <= 1). When the chunks that match an
  -- essential term already give k documents scoring above that bound, the full ranking's
  -- top k is exactly theirs, so the common terms' postings are never read. Otherwise every
  -- candidate is scored (the `full` branch below).
  split as (
    select t.term, (sum(t.df) over (order by t.df, t.term rows between unbounded preceding and 1 preceding)) is null
                   or sum(t.df) over (order by t.df, t.term rows between unbounded preceding and 1 preceding) < 1000
             as essential
    from terms t
  ),
  tsq as (
    select kb.terms_tsquery(array(select term from terms)) as q,
           kb.terms_tsquery(array(select term from split where essential)) as q_essential,
           array(select term from terms) as lexemes,
           (select coalesce(sum(t.idf * ($4 + 1)), 0) from terms t join split s using (term) where not s.essential)
             as common_bound
  ),
  essential_candidates as materialized (
    select c.chunk_id, c.doc_id, c.tsv, c.doc_len,
           ts_filter(setweight(c.tsv, 'A', (select lexemes from tsq)), '{a}') as qtsv
    from kb.chunks c
    where c.tenant_id = (select id from tenant)
      and c.tsv @@ (select q_essential from tsq)
  ),
  essential_top as materialized (
    select * from (
    with matched as (
      -- tf = number of positions (1 for a lexeme stored without positions), as unnest gives
      select cand.chunk_id, cand.doc_id, cand.doc_len, u.lexeme,
             coalesce(array_length(u.positions, 1), 1)::float8 as tf
      from essential_candidates cand
      cross join lateral unnest(cand.qtsv) as u
      union all
      -- query lexemes present without positions (code tokens): ts_filter drops them, tf = 1
      select cand.chunk_id, cand.doc_id, cand.doc_len, t.term, 1::float8
      from terms t
      join essential_candidates cand on cand.tsv @@ t.tq and not (cand.qtsv @@ t.tq)
      where t.may_lack_positions
    ),
    scored as (
      select m.chunk_id, m.doc_id,
             sum(t.idf * (m.tf * ($4 + 1))
                 / (m.tf + $4 * (1 - $5 + $5 * m.doc_len / (select avglen from corpus)))) as score
      from matched m
      join terms t on t.term = m.lexeme
      group by m.chunk_id, m.doc_id
    ),
    best_per_doc as (
      select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
      from scored s
      order by s.doc_id, s.score desc, s.chunk_id
    )
    select * from best_per_doc
    order by score desc, chunk_id
    limit greatest(least($3, 1000), 0)
  ) as x
  ),
  pruned_ok as (
    select $4 >= 0 and $5 >= 0 and $5 <= 1
           and count(*) = greatest(least($3, 1000), 0) and count(*) > 0
           and min(e.score) > (select common_bound from tsq) as ok
    from essential_top e
  ),
  candidates as materialized (
    -- (tenant_id, tsv) GIN index: both conditions are index conditions.
    -- qtsv: the candidate's query lexemes only, with their positions. setweight marks them
    -- and ts_filter keeps them, both in one C pass over the tsvector; unnesting every
    -- lexeme of every candidate instead cost ~50 us per candidate (seconds for a common
    -- word at 100k chunks).
    select c.chunk_id, c.doc_id, c.tsv, c.doc_len,
           ts_filter(setweight(c.tsv, 'A', (select lexemes from tsq)), '{a}') as qtsv
    from kb.chunks c
    where c.tenant_id = (select id from tenant)
      and c.tsv @@ (select q from tsq)
  ),
  full_top as (
    select * from (
    with matched as (
      -- tf = number of positions (1 for a lexeme stored without positions), as unnest gives
      select cand.chunk_id, cand.doc_id, cand.doc_len, u.lexeme,
             coalesce(array_length(u.positions, 1), 1)::float8 as tf
      from candidates cand
      cross join lateral unnest(cand.qtsv) as u
      union all
      -- query lexemes present without positions (code tokens): ts_filter drops them, tf = 1
      select cand.chunk_id, cand.doc_id, cand.doc_len, t.term, 1::float8
      from terms t
      join candidates cand on cand.tsv @@ t.tq and not (cand.qtsv @@ t.tq)
      where t.may_lack_positions
    ),
    scored as (
      select m.chunk_id, m.doc_id,
             sum(t.idf * (m.tf * ($4 + 1))
                 / (m.tf + $4 * (1 - $5 + $5 * m.doc_len / (select avglen from corpus)))) as score
      from matched m
      join terms t on t.term = m.lexeme
      group by m.chunk_id, m.doc_id
    ),
    best_per_doc as (
      select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
      from scored s
      order by s.doc_id, s.score desc, s.chunk_id
    )
    select * from best_per_doc
    order by score desc, chunk_id
    limit greatest(least($3, 1000), 0)
  ) as x
  ),
  top as (
    select * from essential_top where (select coalesce(ok, false) from pruned_ok)
    union all
    select * from full_top where not (select coalesce(ok, false) from pruned_ok)
  )
  select top.chunk_id, top.doc_id, d.title, left(c.content, 300), c.content, top.score,
         (row_number() over (order by top.score desc, top.chunk_id))::integer
  from top
  join kb.chunks c on c.chunk_id = top.chunk_id
  join kb.documents d on d.doc_id = top.doc_id
  order by top.score desc, top.chunk_id
  $q$ using kb.current_tenant(), query, k, k1, b;
end
$fn$;
alter function kb.search_lexical(text, integer, double precision, double precision) owner to kb_search;
comment on function kb.search_lexical(text, integer, double precision, double precision) is
  'BM25 top-k chunks (best chunk per document) for the tenant in auth.tenant_id; empty when unset';
