-- The one accessor for the caller's tenant. The service sets `auth.tenant_id` per
-- transaction (set_config(..., true)); after such a transaction ends the setting reads
-- '' rather than NULL, so both mean "no tenant". Policies call it as
-- (select kb.current_tenant()) so that it is evaluated once per statement.
-- A malformed value raises (invalid input syntax for type uuid): fail closed.
create or replace function kb.current_tenant()
returns uuid
language sql
stable
parallel safe
security invoker
as $$
  select nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
$$;
comment on function kb.current_tenant() is 'Tenant of the current transaction (GUC auth.tenant_id), NULL when unset';
