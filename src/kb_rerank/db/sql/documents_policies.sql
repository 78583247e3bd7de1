-- kb.documents: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed).
alter table kb.documents enable row level security;
alter table kb.documents force row level security;

drop policy if exists "Documents are visible to their tenant" on kb.documents;
drop policy if exists "Documents are inserted by their tenant" on kb.documents;
drop policy if exists "Documents are updated by their tenant" on kb.documents;
drop policy if exists "Documents are deleted by their tenant" on kb.documents;
create policy "Documents are visible to their tenant" on kb.documents
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Documents are inserted by their tenant" on kb.documents
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Documents are updated by their tenant" on kb.documents
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Documents are deleted by their tenant" on kb.documents
  for delete using (tenant_id = (select kb.current_tenant()));

grant select, insert, update, delete on kb.documents to {{app_role}};
-- kb_search owns the search functions, which filter the tenant themselves.
grant select on kb.documents to kb_search;
