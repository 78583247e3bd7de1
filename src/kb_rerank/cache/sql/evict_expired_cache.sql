-- kb.evict_expired_cache(batch): delete up to `batch` expired rows (expires_at <= now()) of
-- all tenants, oldest expiry first: rerank cache rows (kb.kb_rerank_cache) first, then, with
-- what is left of the batch, pair scores (kb.kb_rerank_pair_scores); returns how many in all.
--
-- Why SECURITY DEFINER (owned by kb_maint, which has BYPASSRLS): eviction is cross-tenant
-- by nature (a periodic job, not a tenant's request). The function takes no tenant input,
-- deletes only rows whose expires_at has passed, and returns only a count: no row data, no
-- tenant ids. kb_maint owns nothing else and holds only SELECT, DELETE on
-- kb.kb_rerank_cache and kb.kb_rerank_pair_scores. search_path pinned, pg_temp last.
-- Call it repeatedly until it returns less than `batch`.
-- Who may call it: the maintenance side only (the migrating owner, and
-- any role an operator grants EXECUTE to for KB_MAINT_DATABASE_URL / `kb-rerank evict`),
-- never the app role: its count covers every tenant, so a tenant could watch other
-- tenants' cache traffic through it.


grant usage on schema kb to kb_maint;
grant select, delete on kb.kb_rerank_cache to kb_maint;
grant select, delete on kb.kb_rerank_pair_scores to kb_maint;

create or replace function kb.evict_expired_cache(batch integer default 10000)
returns bigint
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  n bigint;
  m bigint := 0;
begin
  if batch is null or batch < 1 or batch > 1000000 then
    raise exception 'batch must be between 1 and 1000000, got %', batch using errcode = '22023';
  end if;
  with doomed as (
    select c.cache_id
    from kb.kb_rerank_cache c
    where c.expires_at <= now()
    order by c.expires_at
    limit batch
  )
  delete from kb.kb_rerank_cache c
  using doomed d
  where c.cache_id = d.cache_id
    and c.expires_at <= now();
  get diagnostics n = row_count;
  if n < batch then
    with doomed as (
      select p.tenant_id, p.model, p.query_hash, p.chunk_id, p.content_hash
      from kb.kb_rerank_pair_scores p
      where p.expires_at <= now()
      order by p.expires_at
      limit batch - n
    )
    delete from kb.kb_rerank_pair_scores p
    using doomed d
    where p.tenant_id = d.tenant_id and p.model = d.model and p.query_hash = d.query_hash
      and p.chunk_id = d.chunk_id and p.content_hash = d.content_hash
      and p.expires_at <= now();
    get diagnostics m = row_count;
  end if;
  return n + m;
end
$$;
alter function kb.evict_expired_cache(integer) owner to kb_maint;
revoke all on function kb.evict_expired_cache(integer) from public;
revoke all on function kb.evict_expired_cache(integer) from {{app_role}};
-- the role running the migrations (the owner URL) keeps EXECUTE, for `kb-rerank evict`
do $$
begin
  execute format('grant execute on function kb.evict_expired_cache(integer) to %I', current_user);
end
$$;
comment on function kb.evict_expired_cache(integer) is
  'Delete up to batch expired rerank cache rows, then pair scores, of all tenants; returns the count (SECURITY DEFINER, owner kb_maint)';

