-- Downgrade of 0019_term_blocks_name: kb.term_blocks is kb.term_tops again, with the
-- constraint names, policy, rebuild function and trigger it had at 0018, and
-- kb.query_terms / kb.search_terms come back. The idempotent layer is not re-applied by a
-- downgrade, so what 0018's layer had for the table is put back here, as frozen copies of
-- its files as of 0018 (kb.search_lexical reads the table by name).
drop trigger if exists chunks_term_blocks_insert on kb.chunks;
drop trigger if exists chunks_term_blocks_update on kb.chunks;
drop trigger if exists chunks_term_blocks_delete on kb.chunks;
drop function if exists kb.chunks_maintain_term_blocks();
drop function if exists kb.refresh_term_blocks(integer, integer, double precision, double precision);
drop policy if exists "Term blocks are visible to their tenant" on kb.term_blocks;

alter table kb.term_blocks rename to term_tops;
do $$
declare
  c record;
begin
  for c in select conname from pg_catalog.pg_constraint
           where conrelid = 'kb.term_tops'::regclass and conname like 'term\_blocks\_%' loop
    execute format('alter table kb.term_tops rename constraint %I to %I',
                   c.conname, 'term_tops_' || substr(c.conname, length('term_blocks_') + 1));
  end loop;
end
$$;
comment on table kb.term_tops is
  'BM25 impact-ordered blocks: per tenant and common term, its chunks by tf_part in levels (see sql/schema/0014_term_blocks.sql)';

-- ---- the policy of sql/policies/corpus_stats.sql as of 0018 ----
drop policy if exists "Champion lists are visible to their tenant" on kb.term_tops;
create policy "Champion lists are visible to their tenant" on kb.term_tops
  for select using (tenant_id = (select kb.current_tenant()));

-- ---- frozen copy of sql/functions/04_term_tops.sql as of 0018 ----
-- BM25 impact-ordered blocks (kb.term_tops, sql/schema/0008_term_tops.sql and 0014_term_blocks.sql): built per tenant by
-- kb.refresh_term_tops(), kept valid between refreshes by the trigger below.

-- Serialisation: a refresh and the writers of a tenant's chunks lock the
-- tenant's kb.corpus_stats row (a refresh FOR UPDATE before it reads anything; a writer's
-- statistics trigger updates that row in the same statement, and the trigger below locks
-- it again explicitly), so a refresh never misses a chunk written while it runs. An
-- advisory lock key was used before: the app role could compute it and hold it for another
-- tenant, stalling that tenant's writes. The app role can neither update nor lock that row
-- (SELECT only, under RLS).
drop function if exists kb.term_tops_lock_key(uuid);

-- Rebuild the caller's tenant's blocks: for each term in at least min_df chunks, its chunks
-- sorted by tf_part, descending (ties by chunk_id), the first half of them (at least
-- list_length) stored in levels of growing size: level 0 the first list_length chunks,
-- level L the next list_length * 4^L (so a term of df chunks has about log4(df /
-- list_length) levels, and a search that reads to level L has read at most 4/3 of L's
-- size). Each level's tail is the tf_part of the first chunk after it (0 when none): the
-- bound on any chunk outside levels 0..L. The lower half is not stored: below the median
-- tf_part a term's unread bound barely falls (most chunks hold a word once), and a search
-- that must go that deep reads the term's postings through the GIN index instead. Returns
-- the number of terms with blocks.
-- Run it after a bulk load (`kb-rerank ingest` does) or from a nightly job; searches are
-- exact with or without blocks, and with blocks of any age; fresh blocks are only faster.
-- Work: one pass over the tenant's chunks and a sort of their common-term postings
-- (timings: bench/search_bench.py's setup step).
-- SECURITY DEFINER (owner kb_stats: write on the statistics tables only) because the blocks
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
  v_stem_avglen float8;
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
  select cs.total_len::float8 / nullif(cs.n_chunks, 0), cs.stem_total_len::float8 / nullif(cs.n_chunks, 0)
    into v_avglen, v_stem_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant
  for update;
  delete from kb.term_tops tt where tt.tenant_id = v_tenant;
  if v_avglen is null or not v_avglen > 0 then
    return 0;
  end if;
  -- a stemmed term ('~ ...') is weighed with its field's length and average length
  with p as (
    select u.lexeme as term, c.chunk_id, ts.df,
           case when u.lexeme like '~ %'
                then kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.stem_len, k1, b,
                                     greatest(v_stem_avglen, 1e-9))
                else kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.doc_len, k1, b, v_avglen)
           end as w
    from kb.chunks c
    cross join lateral unnest(c.tsv) as u
    join kb.term_stats ts on ts.tenant_id = v_tenant and ts.term = u.lexeme and ts.df >= min_df
    where c.tenant_id = v_tenant
  ),
  ranked as (
    select p.term, p.chunk_id, p.w, p.df,
           row_number() over (partition by p.term order by p.w desc, p.chunk_id) as rn
    from p
  ),
  agg as (
    -- per term, its stored chunks and the first one after them, best first (grouped in
    -- the window's order: no second sort)
    select r.term, greatest(list_length, min(r.df) / 2) as stored,
           array_agg(r.chunk_id order by r.w desc, r.chunk_id) as ids,
           array_agg(r.w order by r.w desc, r.chunk_id) as ws
    from ranked r
    where r.rn <= greatest(list_length, r.df / 2) + 1
    group by r.term
  )
  -- level L: ranks list_length * (4^L - 1) / 3 + 1 .. list_length * (4^(L+1) - 1) / 3, the
  -- last level cut at the stored count; its tail: the tf_part of the next rank (0: none)
  insert into kb.term_tops (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
  select v_tenant, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
         case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, k1, b
  from agg a
  cross join lateral (
    select g.level, list_length * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
           least(list_length * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
    from generate_series(0, 20) as g(level)
  ) as l
  where l.s <= least(a.stored, cardinality(a.ids));
  select count(distinct tt.term) into v_n from kb.term_tops tt where tt.tenant_id = v_tenant;
  return v_n;
end
$$;
alter function kb.refresh_term_tops(integer, integer, double precision, double precision) owner to kb_stats;
revoke all on function kb.refresh_term_tops(integer, integer, double precision, double precision) from public;
grant execute on function kb.refresh_term_tops(integer, integer, double precision, double precision) to {{app_role}};
comment on function kb.refresh_term_tops(integer, integer, double precision, double precision) is
  'Rebuild the BM25 impact-ordered blocks (kb.term_tops) of the tenant in auth.tenant_id; returns the number of terms with blocks';

-- Keeps the invariant of kb.term_tops under INSERT and UPDATE: a written chunk whose
-- tf_part x for a term with blocks exceeds the term's last tail joins the first level whose
-- tail is below x (then it is in levels 0..L for every level L whose tail it exceeds), as a
-- new part of that level: one small row per term and level touched by the statement,
-- instead of rewriting the level's array. (An updated chunk may so be listed twice, or stay
-- listed above its new tf_part: harmless, the search scores each chunk once and exactly.)
-- When a tenant has no chunks left, its blocks go. SECURITY DEFINER (owner kb_stats): it
-- writes derived data from the transition table of a statement RLS has already checked.
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
  -- lock the statistics rows of the written tenants that have blocks (in tenant order, as
  -- the statistics trigger does), so that no refresh of theirs, and no other writer's
  -- append (the part numbers below), runs concurrently
  perform 1
  from kb.corpus_stats cs
  where cs.tenant_id in (select n.tenant_id from new_rows n)
    and exists (select from kb.term_tops tt where tt.tenant_id = cs.tenant_id)
  order by cs.tenant_id
  for update;
  if not found then
    return null;  -- no written tenant has blocks
  end if;
  -- The chunks go into the level's last appended part while it holds fewer than 256 ids
  -- (rewriting at most 4 kB), else into a new part: a level keeps few rows between rebuilds.
  -- (built_at: the rebuild's, which the appended rows belong to)
  with x as (
    select n.tenant_id, t2.term, t2.level, t2.tail, t2.avglen, t2.k1, t2.b, t2.built_at,
           array_agg(distinct n.chunk_id) as ids
    from new_rows n
    cross join lateral unnest(n.tsv) as u
    -- the first level (its part 0, written by the rebuild) whose tail is below x
    cross join lateral (
      select t1.term, t1.level, t1.tail, t1.avglen, t1.k1, t1.b, t1.built_at
      from kb.term_tops t1
      where t1.tenant_id = n.tenant_id and t1.term = u.lexeme and t1.part = 0
        and t1.tail < kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1),
                                      case when u.lexeme like '~ %' then n.stem_len else n.doc_len end,
                                      t1.k1, t1.b, t1.avglen)
      order by t1.level
      limit 1) as t2
    group by n.tenant_id, t2.term, t2.level, t2.tail, t2.avglen, t2.k1, t2.b, t2.built_at
  ),
  last as (
    select x.*, lp.part, lp.n
    from x
    cross join lateral (
      select t3.part, t3.n from kb.term_tops t3
      where t3.tenant_id = x.tenant_id and t3.term = x.term and t3.level = x.level
      order by t3.part desc
      limit 1) as lp
  ),
  grown as (
    update kb.term_tops tt
       set chunk_ids = tt.chunk_ids || l.ids, n = tt.n + cardinality(l.ids)
    from last l
    where l.part > 0 and l.n + cardinality(l.ids) <= 256
      and tt.tenant_id = l.tenant_id and tt.term = l.term and tt.level = l.level and tt.part = l.part
    returning tt.tenant_id, tt.term, tt.level
  )
  insert into kb.term_tops (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b, built_at)
  select l.tenant_id, l.term, l.level, l.part + 1, l.ids, cardinality(l.ids), l.tail, l.avglen, l.k1, l.b, l.built_at
  from last l
  where not exists (select from grown g where g.tenant_id = l.tenant_id and g.term = l.term and g.level = l.level);
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

-- ---- frozen copy of sql/functions/10_search_lexical.sql as of 0018 ----
-- kb.search_lexical(query, k): BM25 over the caller's tenant, best chunk per document.
--
-- Why SECURITY DEFINER (owned by kb_search, which has BYPASSRLS): under RLS the planner may
-- not evaluate `tsv @@ tsquery` before the policy's tenant check, because @@ is not
-- leakproof, so a ranked full-text query run by the app role ignores the GIN index
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
-- and qtf(t) the number of times t occurs in the query (kb.search_term_counts), as in Lucene,
-- where a repeated query word is a repeated clause. An English query's words are stemmed
-- terms ('~ connect', its identifiers exact), another query's are exact (kb.search_term_counts);
-- both fields live in kb.chunks.tsv, and len(d) and avglen are those of the term's field:
-- doc_len for an exact term, stem_len for a stemmed one (migration 0011).
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
-- Top-k retrieval, exact: a threshold algorithm over impact-ordered blocks (block-max
-- MaxScore). A term with blocks (kb.term_tops, built with this k1 and b) has its chunks in
-- levels by descending tf_part; after reading its levels 0..L, any chunk not read through
-- them weighs at most U = w * tail(L) * max(1, avglen now / avglen at build) for it (before
-- any level: w * (k1 + 1), which bounds every BM25 term when k1 >= 0 and 0 <= b <= 1;
-- after reading all its postings through the GIN index: 0). Every chunk read is scored
-- exactly, with all query terms, and merged into the top k. A chunk never read scores at
-- most the sum of the terms' U, so the search stops when the k-th score is above that sum.
-- Otherwise, with terms sorted by U, those whose U add up to less than the k-th score are
-- non-essential (MaxScore): a chunk never read can only enter the top k if it holds an
-- essential term. When the essential terms' unread postings are few against the next
-- levels to read, they are all scored through the (tenant_id, tsv) GIN index and the search
-- ends; else the next level of each term whose U is at least half the largest is read (a
-- level is 4 times its predecessor, so rounds stay few). Round 0 reads level 0 of every
-- term with blocks and, through the GIN index, all chunks of the terms without (rare ones:
-- below the blocks' min_df). A round scores only chunks no earlier round read, and merges
-- them with the previous top k: a document outside that top k cannot enter it through a
-- chunk already scored, since adding candidates only raises the k-th score.
declare
  v_tenant uuid := kb.current_tenant();
  v_k integer := greatest(least(k, 1000), 0);
  v_n float8;
  v_avglen float8;
  v_stem_avglen float8;
  v_terms text[];
  v_df bigint[];
  v_w float8[];
  v_nt integer;
  v_exact boolean := k1 >= 0 and b >= 0 and b <= 1;
  -- levels, flattened: term i's level L (0-based) is entry v_off[i] + L + 1 of v_lb (its
  -- bound: w * tail * widening) and of v_ln (its number of chunks, all parts)
  v_off integer[];
  v_nlev integer[];
  v_lb float8[] := '{}';
  v_ln bigint[] := '{}';
  v_read integer[];      -- levels read per term
  v_readn bigint[];      -- chunks listed in them
  v_gin boolean[];       -- all postings scored through the GIN index
  v_u float8[];
  v_e boolean[];         -- the terms read through the GIN index this round
  v_ids uuid[];          -- chunk ids read from levels this round
  v_seen uuid[] := '{}'; -- chunk ids read from levels so far
  v_gin_q tsquery;
  v_done_q tsquery;      -- terms read through the GIN index by earlier rounds
  v_sum float8;
  v_cum float8;
  v_umax float8;
  v_finish bigint;
  v_step bigint;
  v_cnt integer;
  v_j integer;
  v_last boolean := false;
  v_sub text;
  v_nsub integer;
  v_subest float8;
  v_round integer := 0;
  r_chunk uuid[];
  r_doc uuid[];
  r_score float8[];
  v_min float8;
  v_tq tsquery[];  -- v_tq[i]: the query of term i alone
  v_tf real[] := kb.ts_rank_tf();
  v_score text;
begin
  if v_tenant is null or v_k = 0 then
    return;
  end if;
  select cs.n_chunks::float8, cs.total_len::float8 / greatest(cs.n_chunks, 1),
         cs.stem_total_len::float8 / greatest(cs.n_chunks, 1)
    into v_n, v_avglen, v_stem_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant;
  if v_n is null then
    return;
  end if;
  -- weight of a term = its count in the query (qtf) * idf
  select array_agg(ts.term order by ts.df, ts.term),
         array_agg(ts.df order by ts.df, ts.term),
         array_agg(q.qtf * ln(1 + (v_n - ts.df + 0.5) / (ts.df + 0.5)) order by ts.df, ts.term)
    into v_terms, v_df, v_w
  from kb.search_term_counts(query) as q
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
  -- A stemmed term ('~ ...') is normalised by its field's length (c.stem_len, average $10),
  -- any other by the exact field's (c.doc_len, average $7).
  select array_agg(kb.terms_tsquery(array[t.term]) order by t.i),
         string_agg(format('case when c.tsv @@ $8[%s] then $2[%s] * kb.bm25_tf_part(width_bucket(ts_rank('
                           '''{1,1,1,1}'', c.tsv, $8[%s], 0), $9), %s) else 0 end', t.i, t.i, t.i,
                           case when t.term like '~ %' then 'c.stem_len, $5, $6, $10' else 'c.doc_len, $5, $6, $7' end),
                    ' + ' order by t.i)
    into v_tq, v_score
  from unnest(v_terms) with ordinality as t(term, i);

  -- The levels of the query's terms built with this k1 and b (none when the bounds do not
  -- hold: then every term is read through the GIN index, plain exhaustive scoring).
  v_nlev := array_fill(0, array[v_nt]);
  v_off := array_fill(0, array[v_nt]);
  if v_exact then
    for i in 1 .. v_nt loop
      v_off[i] := cardinality(v_lb);
      select v_lb || coalesce(array_agg(l.bound order by l.level), '{}'),
             v_ln || coalesce(array_agg(l.n order by l.level), '{}'),
             count(*)
        into v_lb, v_ln, v_cnt
      from (select tt.level,
                   v_w[i] * max(tt.tail) * greatest(1, (case when v_terms[i] like '~ %' then v_stem_avglen
                                                            else v_avglen end) / max(tt.avglen)) as bound,
                   sum(tt.n) as n
            from kb.term_tops tt
            where tt.tenant_id = v_tenant and tt.term = v_terms[i]
              and tt.k1 = search_lexical.k1 and tt.b = search_lexical.b
            group by tt.level) as l;
      v_nlev[i] := v_cnt;
    end loop;
  end if;
  v_read := array_fill(0, array[v_nt]);
  v_readn := array_fill(0::bigint, array[v_nt]);
  v_gin := array_fill(false, array[v_nt]);
  v_u := array_fill(0::float8, array[v_nt]);
  -- round 0: level 0 of the terms with levels, the others through the GIN index
  v_e := array(select v_nlev[i] = 0 from generate_series(1, v_nt) as i);
  for i in 1 .. v_nt loop
    if v_nlev[i] > 0 then
      v_read[i] := 1;
      v_readn[i] := v_ln[v_off[i] + 1];
    end if;
  end loop;
  select coalesce(array_agg(distinct x.id), '{}') into v_ids
  from kb.term_tops tt cross join lateral unnest(tt.chunk_ids) as x(id)
  where tt.tenant_id = v_tenant and tt.term = any (v_terms) and tt.level = 0
    and tt.k1 = search_lexical.k1 and tt.b = search_lexical.b and v_exact;

  loop
    if not v_last then
      select kb.terms_tsquery(array_agg(v_terms[i] order by i)) into v_gin_q
      from generate_series(1, v_nt) as i where v_e[i];
    end if;

    -- score this round's chunks (v_score), best chunk per document, top k, merged with the
    -- previous top k. EXECUTE plans with the actual tenant and query (a custom plan): a
    -- generic plan estimates every tenant alike and may scan a large tenant through a btree
    -- on tenant_id instead of the (tenant_id, tsv) GIN index. Scores are rounded to 1e-9 so
    -- that ties do not depend on summation order. A chunk read by an earlier round (through
    -- the GIN index: $11; from a level: $13) is not scored again (v_ids excludes the latter).
    if v_gin_q is not null or cardinality(v_ids) > 0 then
      execute format($q$
        with scored as materialized (
          -- (tenant_id, tsv) GIN index and (tenant_id, chunk_id) key: index conditions
          -- (materialized: planned alone, so that no index in doc_id order replaces it)
          select c.chunk_id, c.doc_id, round((%s) * 1e9) / 1e9 as score
          from kb.chunks c
          where c.tenant_id = $1
            and (%s)%s%s%s
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
        concat_ws(' or ', case when v_gin_q is not null then 'c.tsv @@ $3' end,
                          case when cardinality(v_ids) > 0 then 'c.chunk_id = any ($12)' end),
        case when v_done_q is not null then ' and not (c.tsv @@ $11)' else '' end,
        case when v_gin_q is not null and cardinality(v_seen) > 0
             then ' and c.chunk_id not in (select unnest($13::uuid[]))' else '' end,
        case when r_chunk is not null then $p$
          union all
          select p.chunk_id, p.doc_id, p.score
          from unnest($14::uuid[], $15::uuid[], $16::float8[]) as p(chunk_id, doc_id, score)$p$ else '' end)
      into r_chunk, r_doc, r_score, v_min
      using v_tenant, v_w, v_gin_q, v_k, k1, b, greatest(v_avglen, 1e-9), v_tq, v_tf,
            greatest(v_stem_avglen, 1e-9), v_done_q, v_ids, v_seen, r_chunk, r_doc, r_score;
    end if;
    v_seen := v_seen || v_ids;
    if v_gin_q is not null then
      v_done_q := case when v_done_q is null then v_gin_q else v_done_q || v_gin_q end;
    end if;
    v_round := v_round + 1;
    exit when v_last;

    -- U per term, and the bound of a chunk not read yet: their sum
    v_sum := 0;
    for i in 1 .. v_nt loop
      v_gin[i] := v_gin[i] or v_e[i];
      v_u[i] := case when v_gin[i] then 0
                     when v_read[i] = 0 then v_w[i] * (k1 + 1)
                     else v_lb[v_off[i] + v_read[i]] end;
      v_sum := v_sum + v_u[i];
    end loop;
    -- (the margin covers the rounding of scores to 1e-9 and a tail equal to a score)
    exit when v_sum = 0
           or (coalesce(cardinality(r_chunk), 0) = v_k and v_min > v_sum + 1e-8);
    -- The last round's candidates (coverage): a chunk not read yet scores at most the sum
    -- of U over the terms it holds (it holds none read through the GIN index), so it can
    -- only enter the top k if it holds a set of terms whose U add up to the k-th score
    -- (with fewer than k documents: any term). Those sets are enumerated by adding terms in
    -- descending U until the sum reaches it (each such set holds one that is listed), a
    -- branch dropped once even all the remaining terms cannot reach it; the GIN index then
    -- finds the chunks holding all terms of a listed set (the expected number, as if the
    -- terms were independent, is v_finish). When there are more than 64 sets, the MaxScore
    -- cover instead: the essential terms, all but those (smallest U first) whose U add up
    -- to less than the k-th score.
    v_cum := case when coalesce(cardinality(r_chunk), 0) = v_k then v_min - 1e-8 else 0 end;
    with recursive t as (
      select row_number() over (order by v_u[x.i] desc, x.i) as r, x.i, v_u[x.i] as u,
             greatest(v_df[x.i] - v_readn[x.i], 1)::float8 / v_n as p
      from generate_series(1, v_nt) as x(i)
      where v_u[x.i] > 0
    ),
    suffix as (
      select t.*, sum(t.u) over (order by t.r desc) as rest from t
    ),
    sets(last, terms, su, p) as (
      select f.r, array[f.i], f.u, f.p from suffix f where f.rest >= v_cum
      union all
      select f.r, s2.terms || f.i, s2.su + f.u, s2.p * f.p
      from sets s2 join suffix f on f.r > s2.last
      where s2.su < v_cum and s2.su + f.rest >= v_cum and cardinality(s2.terms) < 16
    )
    select string_agg('(' || (select string_agg(v_tq[x]::text, ' & ') from unnest(s3.terms) as x) || ')', ' | '),
           count(*), sum(s3.p) * v_n
      into v_sub, v_nsub, v_subest
    from (select * from sets where sets.su >= v_cum limit 65) as s3;
    v_e := array(select v_u[i] > 0 from generate_series(1, v_nt) as i);
    v_cum := 0;
    for v_j in select t.i from generate_series(1, v_nt) as t(i) order by v_u[t.i], t.i loop
      exit when coalesce(cardinality(r_chunk), 0) < v_k or v_cum + v_u[v_j] + 1e-8 >= v_min;
      v_cum := v_cum + v_u[v_j];
      v_e[v_j] := false;
    end loop;
    v_finish := 0;
    v_umax := 0;
    for i in 1 .. v_nt loop
      if v_e[i] then
        v_finish := v_finish + greatest(v_df[i] - v_readn[i], 0);
      end if;
      if v_read[i] < v_nlev[i] and v_u[i] > 0 then
        v_umax := greatest(v_umax, v_u[i]);
      end if;
    end loop;
    if v_nsub between 1 and 64 then
      v_finish := least(v_finish, v_subest);
    else
      v_sub := null;
    end if;
    -- a step: the next level of each term whose U is at least half the largest
    v_step := 0;
    for i in 1 .. v_nt loop
      if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
        v_step := v_step + v_ln[v_off[i] + v_read[i] + 1];
      end if;
    end loop;
    v_ids := '{}';
    if v_step > 0 and v_finish > 2 * v_step then
      select coalesce(array_agg(x.id), '{}') into v_ids
      from (select u.id
            from generate_series(1, v_nt) as t(i)
            join kb.term_tops tt
              on tt.tenant_id = v_tenant and tt.term = v_terms[t.i] and tt.level = v_read[t.i]
             and tt.k1 = search_lexical.k1 and tt.b = search_lexical.b
            cross join lateral unnest(tt.chunk_ids) as u(id)
            where v_read[t.i] < v_nlev[t.i] and v_u[t.i] > 0 and v_u[t.i] >= v_umax / 2
            except
            select unnest(v_seen)) as x;
      for i in 1 .. v_nt loop
        if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
          v_readn[i] := v_readn[i] + v_ln[v_off[i] + v_read[i] + 1];
          v_read[i] := v_read[i] + 1;
        end if;
      end loop;
      v_e := array_fill(false, array[v_nt]);
    else
      -- finish: the listed sets' chunks (or the essential terms') through the GIN index
      v_last := true;
      v_gin_q := coalesce(v_sub::tsquery, (select kb.terms_tsquery(array_agg(v_terms[i] order by i))
                                           from generate_series(1, v_nt) as i where v_e[i]));
    end if;
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

-- ---- kb.search_terms and kb.query_terms of sql/functions/01_text_analysis.sql as of 0018 ----
-- The distinct terms of kb.search_term_counts, sorted (what kb.search_lexical searches).
create or replace function kb.search_terms(query text)
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(array_agg(c.term order by c.term), '{}')
  from kb.search_term_counts(query) as c
$$;

-- The distinct lexemes of kb.query_term_counts, sorted.
create or replace function kb.query_terms(query text)
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(array_agg(c.term order by c.term), '{}')
  from kb.query_term_counts(query) as c
$$;

grant execute on function kb.query_terms(text), kb.search_terms(text) to {{app_role}}, kb_search, kb_stats;
