-- Downgrade of 0006_pair_scores (run by its Alembic revision).
-- Drops the table (its policies and grants go with it) and puts back the 0002..0005 body of
-- kb.evict_expired_cache (cache rows only), which would otherwise name a missing table: the
-- idempotent files are re-applied only by an upgrade that reaches head.
drop table if exists kb.kb_rerank_pair_scores;
do $do$
begin
  if to_regprocedure('kb.evict_expired_cache(integer)') is not null then
    create or replace function kb.evict_expired_cache(batch integer default 10000)
    returns bigint
    language plpgsql
    volatile
    security definer
    set search_path = pg_catalog, kb, pg_temp
    as $$
    declare
      n bigint;
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
      return n;
    end
    $$;
    comment on function kb.evict_expired_cache(integer) is
      'Delete up to batch expired rerank cache rows of all tenants; returns the count (SECURITY DEFINER, owner kb_maint)';
  end if;
end
$do$;
