-- kb.document_values: tenant rows (the typed values of kb.documents.metadata), RLS enabled
-- and forced as kb.documents'. Written by the trigger on kb.documents as the writer.
alter table kb.document_values enable row level security;
alter table kb.document_values force row level security;

drop policy if exists "Document values are visible to their tenant" on kb.document_values;
drop policy if exists "Document values are inserted by their tenant" on kb.document_values;
drop policy if exists "Document values are deleted by their tenant" on kb.document_values;
create policy "Document values are visible to their tenant" on kb.document_values
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Document values are inserted by their tenant" on kb.document_values
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Document values are deleted by their tenant" on kb.document_values
  for delete using (tenant_id = (select kb.current_tenant()));

grant select, insert, delete on kb.document_values to {{app_role}};
-- kb_search owns the search functions, which filter the tenant themselves.
grant select on kb.document_values to kb_search;
