-- BM25 term blocks (kb.term_blocks; db/schema/0008_term_tops.sql, 0014_term_blocks.sql, and
-- 0019_term_blocks_name.sql, which gave the table, its functions and triggers this one name):
-- per tenant and common term, its chunks by BM25 weight in levels. Built per tenant by
-- kb.refresh_term_blocks(), kept valid between refreshes by the trigger below.

-- Serialisation: a refresh and the writers of a tenant's chunks lock the
-- tenant's kb.corpus_stats row (a refresh FOR UPDATE before it reads anything; a writer's
-- statistics trigger updates that row in the same statement, and the trigger below locks
-- it again explicitly), so a refresh never misses a chunk written while it runs. An
-- advisory lock key was used before: the app role could compute it and hold it for another
-- tenant, stalling that tenant's writes. The app role can neither update nor lock that row
-- (SELECT only, under RLS); 0010_trust_privileges dropped it.

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
create or replace function kb.refresh_term_blocks(
  list_length integer default {{default:term_list_length}},
  min_df integer default {{default:term_list_min_df}},
  k1 double precision default {{default:bm25_k1}},
  b double precision default {{default:bm25_b}}
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
  delete from kb.term_blocks tt where tt.tenant_id = v_tenant;
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
      and u.lexeme not like '@language %'  -- a chunk's language (kb.language_lexeme): never searched
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
  insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
  select v_tenant, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
         case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, k1, b
  from agg a
  cross join lateral (
    select g.level, list_length * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
           least(list_length * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
    from generate_series(0, 20) as g(level)
  ) as l
  where l.s <= least(a.stored, cardinality(a.ids));
  select count(distinct tt.term) into v_n from kb.term_blocks tt where tt.tenant_id = v_tenant;
  return v_n;
end
$$;
alter function kb.refresh_term_blocks(integer, integer, double precision, double precision) owner to kb_stats;
revoke all on function kb.refresh_term_blocks(integer, integer, double precision, double precision) from public;
grant execute on function kb.refresh_term_blocks(integer, integer, double precision, double precision) to {{app_role}};
comment on function kb.refresh_term_blocks(integer, integer, double precision, double precision) is
  'Rebuild the BM25 term blocks (kb.term_blocks) of the tenant in auth.tenant_id; returns the number of terms with blocks';

-- Keeps the invariant of kb.term_blocks under INSERT and UPDATE: a written chunk whose
-- tf_part x for a term with blocks exceeds the term's last tail joins the first level whose
-- tail is below x (then it is in levels 0..L for every level L whose tail it exceeds), as a
-- new part of that level: one small row per term and level touched by the statement,
-- instead of rewriting the level's array. (An updated chunk may so be listed twice, or stay
-- listed above its new tf_part: harmless, the search scores each chunk once and exactly.)
-- When a tenant has no chunks left, its blocks go. SECURITY DEFINER (owner kb_stats): it
-- writes derived data from the transition table of a statement RLS has already checked.
create or replace function kb.chunks_maintain_term_blocks()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op = 'DELETE' then
    delete from kb.term_blocks tt
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
    and exists (select from kb.term_blocks tt where tt.tenant_id = cs.tenant_id)
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
      from kb.term_blocks t1
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
      select t3.part, t3.n from kb.term_blocks t3
      where t3.tenant_id = x.tenant_id and t3.term = x.term and t3.level = x.level
      order by t3.part desc
      limit 1) as lp
  ),
  grown as (
    update kb.term_blocks tt
       set chunk_ids = tt.chunk_ids || l.ids, n = tt.n + cardinality(l.ids)
    from last l
    where l.part > 0 and l.n + cardinality(l.ids) <= 256
      and tt.tenant_id = l.tenant_id and tt.term = l.term and tt.level = l.level and tt.part = l.part
    returning tt.tenant_id, tt.term, tt.level
  )
  insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b, built_at)
  select l.tenant_id, l.term, l.level, l.part + 1, l.ids, cardinality(l.ids), l.tail, l.avglen, l.k1, l.b, l.built_at
  from last l
  where not exists (select from grown g where g.tenant_id = l.tenant_id and g.term = l.term and g.level = l.level);
  return null;
end
$$;
alter function kb.chunks_maintain_term_blocks() owner to kb_stats;
revoke all on function kb.chunks_maintain_term_blocks() from public;

drop trigger if exists chunks_term_blocks_insert on kb.chunks;
drop trigger if exists chunks_term_blocks_update on kb.chunks;
drop trigger if exists chunks_term_blocks_delete on kb.chunks;
create trigger chunks_term_blocks_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
create trigger chunks_term_blocks_update after update on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
create trigger chunks_term_blocks_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
