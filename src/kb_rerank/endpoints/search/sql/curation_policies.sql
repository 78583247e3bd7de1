-- kb.kb_rerank_curation: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). The foreign key on
-- (tenant_id, chunk_id) keeps every pinned chunk inside the curating tenant.


alter table kb.kb_rerank_curation enable row level security;
alter table kb.kb_rerank_curation force row level security;

drop policy if exists "Curations are visible to their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are inserted by their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are updated by their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are deleted by their tenant" on kb.kb_rerank_curation;
create policy "Curations are visible to their tenant" on kb.kb_rerank_curation
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Curations are inserted by their tenant" on kb.kb_rerank_curation
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Curations are updated by their tenant" on kb.kb_rerank_curation
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Curations are deleted by their tenant" on kb.kb_rerank_curation
  for delete using (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_curation from {{app_role}};
grant select, insert, update, delete on kb.kb_rerank_curation to {{app_role}};

