-- kb.chunks: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed).
alter table kb.chunks enable row level security;
alter table kb.chunks force row level security;

drop policy if exists "Chunks are visible to their tenant" on kb.chunks;
drop policy if exists "Chunks are inserted by their tenant" on kb.chunks;
drop policy if exists "Chunks are updated by their tenant" on kb.chunks;
drop policy if exists "Chunks are deleted by their tenant" on kb.chunks;
create policy "Chunks are visible to their tenant" on kb.chunks
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Chunks are inserted by their tenant" on kb.chunks
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Chunks are updated by their tenant" on kb.chunks
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Chunks are deleted by their tenant" on kb.chunks
  for delete using (tenant_id = (select kb.current_tenant()));

grant select, insert, update, delete on kb.chunks to {{app_role}};
-- kb_search owns the search functions, which filter the tenant themselves.
grant select on kb.chunks to kb_search;
