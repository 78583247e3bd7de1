-- Operational views over the rerank cache and audit log. security_invoker = true: the
-- underlying tables' RLS applies to whoever queries the view, so the app role sees only
-- its tenant's rows; a role exempt from RLS (a superuser) sees every tenant.


-- Per tenant and source. table_bytes is the size of the whole cache table (all tenants,
-- indexes and TOAST included), the same on every row: it is what eviction frees, and
-- says nothing about any one tenant.
create or replace view kb.cache_stats with (security_invoker = true) as
  with size as (
    select pg_catalog.pg_total_relation_size('kb.kb_rerank_cache'::regclass) as bytes
  )
  select c.tenant_id,
         c.source,
         count(*) as total_rows,
         count(*) filter (where c.expires_at > now()) as live_rows,
         count(*) filter (where c.expires_at <= now()) as expired_rows,
         min(c.cached_at) as oldest_cached_at,
         max(c.cached_at) as newest_cached_at,
         (select bytes from size) as table_bytes,
         pg_catalog.pg_size_pretty((select bytes from size)) as table_size
  from kb.kb_rerank_cache c
  group by c.tenant_id, c.source;
comment on view kb.cache_stats is 'Rerank cache rows per tenant and source (RLS applies); table_bytes covers all tenants';

create or replace view kb.audit_summary with (security_invoker = true) as
  select a.tenant_id, a.kind, a.severity, count(*) as entries, max(a.created_at) as last_created_at
  from kb.kb_rerank_audit a
  group by a.tenant_id, a.kind, a.severity;
comment on view kb.audit_summary is 'Audit entries per tenant, kind and severity (RLS applies)';

-- hits: kind 'cache_hit'; misses: kinds 'served' and 'fallback' ('rejected' is neither).
-- ratio = hits / (hits + misses), NULL when both are 0.
create or replace view kb.cache_hit_ratio with (security_invoker = true) as
  select s.tenant_id, s.hits, s.misses,
         s.hits::float8 / nullif(s.hits + s.misses, 0) as ratio
  from (
    select a.tenant_id,
           count(*) filter (where a.kind = 'cache_hit') as hits,
           count(*) filter (where a.kind in ('served', 'fallback')) as misses
    from kb.kb_rerank_audit a
    group by a.tenant_id
  ) s;
comment on view kb.cache_hit_ratio is 'Rerank cache hit ratio per tenant from the audit log (RLS applies)';

grant select on kb.cache_stats, kb.audit_summary, kb.cache_hit_ratio to {{app_role}};

