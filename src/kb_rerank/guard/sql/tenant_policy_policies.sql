-- kb.tenant_policy: one row per tenant, RLS enabled and forced (the owner is subject to it
-- too). Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). The app may read,
-- create and change its own tenant's row; it never deletes it (no DELETE grant or policy).
alter table kb.tenant_policy enable row level security;
alter table kb.tenant_policy force row level security;

drop policy if exists "Tenant policies are visible to their tenant" on kb.tenant_policy;
drop policy if exists "Tenant policies are inserted by their tenant" on kb.tenant_policy;
drop policy if exists "Tenant policies are updated by their tenant" on kb.tenant_policy;
create policy "Tenant policies are visible to their tenant" on kb.tenant_policy
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Tenant policies are inserted by their tenant" on kb.tenant_policy
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Tenant policies are updated by their tenant" on kb.tenant_policy
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.tenant_policy from {{app_role}};
grant select, insert, update on kb.tenant_policy to {{app_role}};
