-- BM25 champion lists (kb.term_tops, sql/schema/0008_term_tops.sql): built per tenant by
-- kb.refresh_term_tops(), kept valid between refreshes by the trigger below.

-- Serialisation (issue 13, item 12): a refresh and the writers of a tenant's chunks lock the
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
  insert into kb.term_tops (tenant_id, term, chunk_ids, tail, avglen, k1, b)
  -- a stemmed term ('~ ...') is weighed with its field's length and average length
  select v_tenant, r.term,
         array_agg(r.chunk_id order by r.rn) filter (where r.rn <= list_length),
         coalesce(max(r.w) filter (where r.rn > list_length), 0),
         case when r.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, k1, b
  from (select p.term, p.chunk_id, p.w,
               row_number() over (partition by p.term order by p.w desc, p.chunk_id) as rn
        from (select u.lexeme as term, c.chunk_id,
                     case when u.lexeme like '~ %'
                          then kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.stem_len, k1, b,
                                               greatest(v_stem_avglen, 1e-9))
                          else kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.doc_len, k1, b, v_avglen)
                     end as w
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
        where kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1),
                              case when u.lexeme like '~ %' then n.stem_len else n.doc_len end,
                              t2.k1, t2.b, t2.avglen) > t2.tail
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
