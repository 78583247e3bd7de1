-- Downgrade of 0011_english_stem: chunks without the stemmed field, its columns and functions
-- dropped. The idempotent files are not re-applied by a downgrade, so the
-- live functions that read the dropped columns (the chunk trigger, the statistics and
-- champion-list triggers, kb.refresh_term_tops, kb.search_lexical) are first put back as
-- they were at 0010 (frozen copies below): the search and writes keep working at 0010.

-- ---- frozen copy of sql/functions/02_chunks_derive.sql as of 0010 ----
-- BEFORE trigger: derive the lexical columns of a chunk from its content.
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  new.tsv := kb.to_tsv(new.content);
  new.doc_len := kb.doc_length(new.content);
  return new;
end
$$;

drop trigger if exists chunks_derive on kb.chunks;
create trigger chunks_derive
  before insert or update of content on kb.chunks
  for each row execute function kb.chunks_derive();

-- ---- frozen copy of sql/functions/03_corpus_stats.sql as of 0010 ----
-- BM25 statistics per tenant (kb.term_stats: document frequency per lexeme;
-- kb.corpus_stats: chunk count and total length), kept exact under insert, update and
-- delete by statement-level triggers with transition tables.
--
-- SECURITY DEFINER, owned by kb_stats (BYPASSRLS; SELECT on kb.chunks and write on the
-- statistics tables kb.term_stats, kb.corpus_stats, kb.term_tops only, nothing else): the
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
  insert into kb.corpus_stats as cs (tenant_id, n_chunks, total_len)
  select r.tenant_id, sign * count(*), sign * sum(r.doc_len)
  from unnest(rows) as r
  group by r.tenant_id
  order by r.tenant_id
  on conflict (tenant_id) do update
    set n_chunks = cs.n_chunks + excluded.n_chunks,
        total_len = cs.total_len + excluded.total_len;

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

-- ---- frozen copy of sql/functions/04_term_tops.sql as of 0010 ----
-- BM25 champion lists (kb.term_tops, sql/schema/0008_term_tops.sql): built per tenant by
-- kb.refresh_term_tops(), kept valid between refreshes by the trigger below.

-- Serialisation: a refresh and the writers of a tenant's chunks lock the
-- tenant's kb.corpus_stats row (a refresh FOR UPDATE before it reads anything; a writer's
-- statistics trigger updates that row in the same statement, and the trigger below locks
-- it again explicitly), so a refresh never misses a chunk written while it runs. An
-- advisory lock key was used before: the app role could compute it and hold it for another
-- tenant, stalling that tenant's writes. The app role can neither update nor lock that row
-- (SELECT only, under RLS).
drop function if exists kb.term_tops_lock_key(uuid);

-- Rebuild the caller's tenant's lists: for each term in at least min_df chunks, the
-- list_length chunks with the highest tf_part (ties by chunk_id), and tail = the next
-- one's tf_part (0 when the term has no more chunks). Returns the number of lists.
-- Run it after a bulk load (`kb-rerank ingest` does) or from a nightly job; searches are
-- exact with or without lists, and with lists of any age; fresh lists are only faster.
-- Work: one pass over the tenant's chunks and a sort of their common-term postings (here,
-- lists of 128: 38 s for one tenant of 100k chunks, 25 s for 100k chunks over 10 tenants,
-- 411 s for 1M over 10; bench/search_bench.py's setup step).
-- SECURITY DEFINER (owner kb_stats: write on the statistics tables only) because the lists
-- are derived data the app role may read but not write; it only ever touches the tenant of
-- the caller's transaction (kb.current_tenant()) and raises when none is set. search_path
-- pinned, pg_temp last.
create or replace function kb.refresh_term_tops(
  list_length integer default 128,
  min_df integer default 1000,
  k1 double precision default 1.2,
  b double precision default 0.75
)
returns integer
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
set work_mem = '256MB'
as $$
declare
  v_tenant uuid := kb.current_tenant();
  v_avglen float8;
  v_n integer;
begin
  if v_tenant is null then
    raise exception 'no tenant: set auth.tenant_id for the transaction' using errcode = '42501';
  end if;
  if list_length is null or list_length < 1 or list_length > 100000 then
    raise exception 'list_length must be between 1 and 100000, got %', list_length using errcode = '22023';
  end if;
  if min_df is null or min_df < 1 then
    raise exception 'min_df must be >= 1, got %', min_df using errcode = '22023';
  end if;
  if k1 is null or k1 < 0 or b is null or b < 0 or b > 1 then
    raise exception 'k1 must be >= 0 and b between 0 and 1, got k1 = %, b = %', k1, b using errcode = '22023';
  end if;
  -- the tenant's statistics row, locked: writers of the tenant's chunks wait (see above)
  select cs.total_len::float8 / nullif(cs.n_chunks, 0) into v_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant
  for update;
  delete from kb.term_tops tt where tt.tenant_id = v_tenant;
  if v_avglen is null or not v_avglen > 0 then
    return 0;
  end if;
  insert into kb.term_tops (tenant_id, term, chunk_ids, tail, avglen, k1, b)
  select v_tenant, r.term,
         array_agg(r.chunk_id order by r.rn) filter (where r.rn <= list_length),
         coalesce(max(r.w) filter (where r.rn > list_length), 0),
         v_avglen, k1, b
  from (select p.term, p.chunk_id, p.w,
               row_number() over (partition by p.term order by p.w desc, p.chunk_id) as rn
        from (select u.lexeme as term, c.chunk_id,
                     kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.doc_len, k1, b, v_avglen) as w
              from kb.chunks c
              cross join lateral unnest(c.tsv) as u
              where c.tenant_id = v_tenant
                and u.lexeme in (select ts.term from kb.term_stats ts
                                 where ts.tenant_id = v_tenant and ts.df >= min_df)) as p) as r
  where r.rn <= list_length + 1
  group by r.term;
  get diagnostics v_n = row_count;
  return v_n;
end
$$;
alter function kb.refresh_term_tops(integer, integer, double precision, double precision) owner to kb_stats;
revoke all on function kb.refresh_term_tops(integer, integer, double precision, double precision) from public;
grant execute on function kb.refresh_term_tops(integer, integer, double precision, double precision) to cyberos_app;
comment on function kb.refresh_term_tops(integer, integer, double precision, double precision) is
  'Rebuild the BM25 champion lists (kb.term_tops) of the tenant in auth.tenant_id; returns the number of lists';

-- Keeps the invariant of kb.term_tops under INSERT and UPDATE: a written chunk whose
-- tf_part for a listed term exceeds the list's tail joins the list. When a tenant has no
-- chunks left, its lists go. SECURITY DEFINER (owner kb_stats): it writes derived data
-- from the transition table of a statement RLS has already checked.
create or replace function kb.chunks_maintain_term_tops()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op = 'DELETE' then
    delete from kb.term_tops tt
    where tt.tenant_id in (select distinct o.tenant_id from old_rows o)
      and not exists (select from kb.chunks c where c.tenant_id = tt.tenant_id);
    return null;
  end if;
  -- lock the statistics rows of the written tenants that have lists (in tenant order, as
  -- the statistics trigger does), so that no refresh of theirs runs concurrently
  perform 1
  from kb.corpus_stats cs
  where cs.tenant_id in (select n.tenant_id from new_rows n)
    and exists (select from kb.term_tops tt where tt.tenant_id = cs.tenant_id)
  order by cs.tenant_id
  for update;
  if not found then
    return null;  -- no written tenant has lists
  end if;
  update kb.term_tops tt
     set chunk_ids = tt.chunk_ids || x.ids
  from (select n.tenant_id, u.lexeme, array_agg(distinct n.chunk_id) as ids
        from new_rows n
        cross join lateral unnest(n.tsv) as u
        join kb.term_tops t2 on t2.tenant_id = n.tenant_id and t2.term = u.lexeme
        where kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), n.doc_len, t2.k1, t2.b, t2.avglen) > t2.tail
          and not (n.chunk_id = any (t2.chunk_ids))
        group by n.tenant_id, u.lexeme) as x
  where tt.tenant_id = x.tenant_id and tt.term = x.lexeme;
  return null;
end
$$;
alter function kb.chunks_maintain_term_tops() owner to kb_stats;
revoke all on function kb.chunks_maintain_term_tops() from public;

drop trigger if exists chunks_term_tops_insert on kb.chunks;
drop trigger if exists chunks_term_tops_update on kb.chunks;
drop trigger if exists chunks_term_tops_delete on kb.chunks;
create trigger chunks_term_tops_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_tops();
create trigger chunks_term_tops_update after update on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_tops();
create trigger chunks_term_tops_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.chunks_maintain_term_tops();

-- ---- frozen copy of sql/functions/10_search_lexical.sql as of 0010 ----
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
--   score(d) = sum over distinct query terms t in d of
--              qtf(t) * idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avglen))
-- with N, df and avglen taken from the caller's tenant only (kb.corpus_stats, kb.term_stats),
-- and qtf(t) the number of times t occurs in the query (kb.query_term_counts), as in Lucene,
-- where a repeated query word is a repeated clause.
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
set search_path = pg_catalog, kb, pg_temp
as $fn$
-- Top-k retrieval, exact, in stages (MaxScore with a two-term refinement).
-- Query terms are sorted rarest first. At each stage the first `ne` terms are
-- "essential"; of the other ("common") terms, P = the eight rarest that are in fewer than a
-- quarter of the tenant's chunks (an eighth for terms with a champion list), R = the rest.
-- Candidates are the chunks that match an essential term or at least two terms of P, and
-- every candidate is scored with all terms. Each BM25 term is below its bound
-- qtf * idf * (k1 + 1) (k1 >= 0, 0 <= b <= 1), or, for a term with a champion list
-- (kb.term_tops) and a chunk outside it, qtf * idf * tail (widened for a changed average
-- length); the first stage also scores the listed chunks. A chunk outside the candidates
-- matches at most one term of P plus terms of R, so it scores at most
-- max(bound over P) + sum(bound over R). When the candidates already give k
-- documents above that bound, their top k is exactly the full ranking's top k, and the long
-- postings of the common terms were never read on their own. Otherwise the next stage
-- makes more terms essential (at least doubling the postings read); the last stage has
-- every term essential, which is plain exhaustive scoring. A stage skips the chunks the
-- previous stage scored (tsv @@ old) and merges its own with the previous top k: a document
-- outside that top k cannot enter it through a chunk already scored, since adding
-- candidates only raises the k-th score.
-- The first stage's essential terms: the rarest, and the next while their postings add up
-- to fewer than 1000 (the setting kb.lexical_essential_postings, if set, replaces 1000;
-- results do not depend on it, only the work done: the tests lower it to prune small corpora).
declare
  v_tenant uuid := kb.current_tenant();
  v_k integer := greatest(least(k, 1000), 0);
  v_n float8;
  v_avglen float8;
  v_terms text[];
  v_df bigint[];
  v_w float8[];
  v_u float8[];
  v_listed boolean[];
  v_extra uuid[];
  v_lists boolean := false;  -- the stage about to run also scores the listed chunks
  v_nt integer;
  v_ne integer;
  v_cum bigint;
  v_target bigint;
  v_p text[];
  v_bound float8;
  v_p_max float8;
  v_q tsquery;
  v_prev_q tsquery;
  v_exact boolean := k1 >= 0 and b >= 0 and b <= 1;
  r_chunk uuid[];
  r_doc uuid[];
  r_score float8[];
  v_min float8;
  v_first_postings bigint := case when current_setting('kb.lexical_essential_postings', true) ~ '^[0-9]{1,9}$'
                                  then current_setting('kb.lexical_essential_postings', true)::bigint
                                  else 1000 end;
  v_tq tsquery[];  -- v_tq[i]: the query of term i alone
  v_tf real[] := kb.ts_rank_tf();
  v_score text;
begin
  if v_tenant is null or v_k = 0 then
    return;
  end if;
  select cs.n_chunks::float8, cs.total_len::float8 / greatest(cs.n_chunks, 1)
    into v_n, v_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant;
  if v_n is null then
    return;
  end if;
  -- weight of a term = its count in the query (qtf) * idf
  select array_agg(ts.term order by ts.df, ts.term),
         array_agg(ts.df order by ts.df, ts.term),
         array_agg(q.qtf * ln(1 + (v_n - ts.df + 0.5) / (ts.df + 0.5)) order by ts.df, ts.term)
    into v_terms, v_df, v_w
  from kb.query_term_counts(query) as q
  join kb.term_stats ts on ts.tenant_id = v_tenant and ts.term = q.term
  where ts.df > 0;
  v_nt := coalesce(array_length(v_terms, 1), 0);
  if v_nt = 0 then
    return;
  end if;
  -- A chunk's score, one expression over its tsvector: term i contributes
  -- v_w[i] * kb.bm25_tf_part(tf), tf read by ts_rank (see kb.ts_rank_tf; a lexeme stored
  -- without positions, as code tokens may be, counts once), guarded by tsv @@ term: the
  -- check costs half a ts_rank call, and a chunk holds few of a long query's terms (on
  -- CISI's long queries the unguarded form was 6% slower on average than unnesting, the
  -- guarded one 3% faster). Two entries of the constant are checked against this server's
  -- ts_rank; it is computed afresh if they differ.
  if ts_rank('{1,1,1,1}', 'x:1'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[1]
     or ts_rank('{1,1,1,1}', 'x:1,2,3'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[3] then
    v_tf := kb.ts_rank_tf_compute();
  end if;
  select array_agg(kb.terms_tsquery(array[t.term]) order by t.i),
         string_agg(format('case when c.tsv @@ $8[%s] then $2[%s] * kb.bm25_tf_part(width_bucket(ts_rank('
                           '''{1,1,1,1}'', c.tsv, $8[%s], 0), $9), c.doc_len, $5, $6, $7) else 0 end', t.i, t.i, t.i),
                    ' + ' order by t.i)
    into v_tq, v_score
  from unnest(v_terms) with ordinality as t(term, i);

  -- Champion lists (kb.term_tops) of the query's terms, built with this k1 and b. v_u[i]
  -- bounds term i's weight in a chunk outside its list: w * tail * max(1, avglen now /
  -- avglen at build), or w * (k1 + 1) without a list. The first stage also scores every
  -- listed chunk, so from then on v_u bounds a listed term in any chunk not yet scored.
  -- The table is checked for, so that a database downgraded below migration 0008 (which
  -- drops it) still searches.
  v_u := array(select v_w[i] * (k1 + 1) from generate_series(1, v_nt) as i);
  if v_exact and to_regclass('kb.term_tops') is not null then
    select array_agg(coalesce(tt.tail * greatest(1, v_avglen / tt.avglen), search_lexical.k1 + 1)
                     * v_w[t.i] order by t.i),
           array_agg(tt.term is not null order by t.i),
           bool_or(tt.term is not null)
      into v_u, v_listed, v_lists
    from unnest(v_terms) with ordinality as t(term, i)
    left join kb.term_tops tt
      on tt.tenant_id = v_tenant and tt.term = t.term
     and tt.k1 = search_lexical.k1 and tt.b = search_lexical.b;
    if v_lists then
      select array_agg(x.id)
        into v_extra
      from kb.term_tops tt
      cross join lateral unnest(tt.chunk_ids) as x(id)
      where tt.tenant_id = v_tenant and tt.term = any (v_terms)
        and tt.k1 = search_lexical.k1 and tt.b = search_lexical.b;
    end if;
  end if;

  v_ne := 1;
  v_cum := v_df[1];
  while v_ne < v_nt and v_cum + v_df[v_ne + 1] < v_first_postings loop
    v_ne := v_ne + 1;
    v_cum := v_cum + v_df[v_ne];
  end loop;
  -- With lists, when even the rarest term is common and listed, and the chunks holding two
  -- of the (up to 8) rarest terms in under a quarter of the chunks are expected (as if the
  -- terms were independent) to be under half of the rarest term's chunks, the first stage
  -- has no essential term: its candidates are those pairs (and the listed chunks).
  if v_lists and v_listed[1] and v_df[1] >= v_first_postings
     and (with p as (select i from generate_series(1, v_nt) as i where v_df[i] < v_n / 4 order by i limit 8)
          select coalesce(sum(v_df[a.i] * v_df[b2.i] / v_n), 0)
          from p as a join p as b2 on b2.i > a.i) < 0.5 * v_df[1] then
    v_ne := 0;
    v_cum := 0;
  end if;
  if not v_exact then
    v_ne := v_nt;  -- the bounds need k1 >= 0 and 0 <= b <= 1: score everything
  end if;

  loop
    -- P, and the bound on chunks outside the candidates: max over P + sum over R
    v_p := '{}';
    v_p_max := 0;
    v_bound := 0;
    for i in v_ne + 1 .. v_nt loop
      -- except in a stage without essential terms, a listed term in an eighth of the chunks
      -- or more stays in R, bounded by its tail: its pairs would add more candidates than
      -- its tail bound costs. (These rules were chosen by counting the chunks scored in a
      -- simulation of this function, bench/lexical_sim.py, on the search benchmark's 34k-,
      -- 100k- and 341k-chunk tenants, 200 queries each, and by timing them.)
      if cardinality(v_p) < 8 and v_df[i] < v_n / 4
         and (v_ne = 0 or not (coalesce(v_listed[i], false) and v_df[i] >= v_n / 8)) then
        v_p := v_p || v_terms[i];
        v_p_max := greatest(v_p_max, v_u[i]);
      else
        v_bound := v_bound + v_u[i];
      end if;
    end loop;
    v_bound := v_bound + v_p_max;
    select string_agg(x.q::text, ' | ')::tsquery
      into v_q
    from (select kb.terms_tsquery(v_terms[1:v_ne]) as q
          union all
          select kb.terms_tsquery(array[a.t]) && kb.terms_tsquery(array[b2.t])
          from unnest(v_p) with ordinality as a(t, i)
          join unnest(v_p) with ordinality as b2(t, i) on b2.i > a.i) as x;

    -- score the candidates (v_score), best chunk per document, top k. EXECUTE plans with the
    -- actual tenant and query (a custom plan): a generic plan estimates every tenant alike
    -- and may scan a large tenant through a btree on tenant_id instead of the (tenant_id,
    -- tsv) GIN index. Scores are rounded to 1e-9 so that ties do not depend on summation
    -- order. The statement holds only the parts this stage needs (planning it is a fixed
    -- cost of every stage); a stage without candidates is not run at all.
    if v_q is not null or v_lists then
      execute format($q$
        with scored as materialized (
          -- (tenant_id, tsv) GIN index: both conditions are index conditions (materialized:
          -- planned alone, so that no index in doc_id order replaces it to save the sort)
          select c.chunk_id, c.doc_id, round((%s) * 1e9) / 1e9 as score
          from kb.chunks c
          where c.tenant_id = $1
            and %s%s%s
        ),
        top as (
          select x.chunk_id, x.doc_id, x.score
          from (select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
                from scored s
                order by s.doc_id, s.score desc, s.chunk_id) as x
          order by x.score desc, x.chunk_id
          limit $4
        )
        select array_agg(chunk_id order by score desc, chunk_id),
               array_agg(doc_id order by score desc, chunk_id),
               array_agg(score order by score desc, chunk_id),
               min(score)
        from top
      $q$,
        v_score,
        -- the first stage adds the listed chunks (chunks_tenant_chunk_key: (tenant_id, chunk_id))
        case when v_lists then '(c.tsv @@ $3 or c.chunk_id = any ($14))' else 'c.tsv @@ $3' end,
        -- a later stage scores only the chunks that the previous one did not
        case when v_prev_q is not null then ' and not (c.tsv @@ $10)' else '' end,
        -- and merges them with the previous stage's top k
        case when r_chunk is not null then $p$
          union all
          select p.chunk_id, p.doc_id, p.score
          from unnest($11::uuid[], $12::uuid[], $13::float8[]) as p(chunk_id, doc_id, score)$p$ else '' end)
      into r_chunk, r_doc, r_score, v_min
      using v_tenant, v_w, v_q, v_k, k1, b, greatest(v_avglen, 1e-9), v_tq, v_tf,
            v_prev_q, r_chunk, r_doc, r_score, v_extra;
    end if;

    -- (the margin covers the rounding of scores to 1e-9 and a tail equal to a score)
    exit when v_ne >= v_nt
           or (coalesce(cardinality(r_chunk), 0) = v_k and v_min > v_bound + 1e-8);
    v_prev_q := coalesce(v_q, v_prev_q);  -- (the chunks of a stage that ran are all scored)
    v_lists := false;  -- scored once: later stages keep the tail bounds, not the chunks
    -- next stage: at least double the essential postings
    v_target := 2 * v_cum;
    loop
      v_ne := v_ne + 1;
      v_cum := v_cum + v_df[v_ne];
      exit when v_ne >= v_nt or v_cum >= v_target;
    end loop;
  end loop;

  return query
    select t.chunk_id, t.doc_id, d.title, left(c.content, 300), c.content, t.score, t.rank::integer
    from unnest(r_chunk, r_doc, r_score) with ordinality as t(chunk_id, doc_id, score, rank)
    join kb.chunks c on c.chunk_id = t.chunk_id and c.tenant_id = v_tenant
    join kb.documents d on d.doc_id = t.doc_id and d.tenant_id = v_tenant
    order by t.rank;
end
$fn$;
alter function kb.search_lexical(text, integer, double precision, double precision) owner to kb_search;
comment on function kb.search_lexical(text, integer, double precision, double precision) is
  'BM25 top-k chunks (best chunk per document) for the tenant in auth.tenant_id; empty when unset';

-- ---- data step ----
-- The update trigger (0010's) re-derives tsv without the stemmed lexemes; the statistics
-- trigger drops their df. Their champion lists go.
update kb.chunks set content = content;
delete from kb.term_tops where term like '~ %';

alter table kb.corpus_stats drop column stem_total_len;
alter table kb.chunks drop column stem_len;
drop function if exists kb.search_terms(text);
drop function if exists kb.search_term_counts(text);
drop function if exists kb.query_stems(text);
drop function if exists kb.stem_tsv(text, text);
drop function if exists kb.stem_length(tsvector);
drop function if exists kb.stem_config(text);
