-- kb.kb_rerank_audit: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Append-only for the app: SELECT and INSERT (through kb.audit_append), no UPDATE,
-- DELETE or TRUNCATE, and no policy that would allow them. Policies compare with
-- (select kb.current_tenant()), evaluated once per statement; with no tenant set it is
-- NULL and nothing matches (fail closed).


alter table kb.kb_rerank_audit enable row level security;
alter table kb.kb_rerank_audit force row level security;

drop policy if exists "Audit entries are visible to their tenant" on kb.kb_rerank_audit;
drop policy if exists "Audit entries are appended by their tenant" on kb.kb_rerank_audit;
create policy "Audit entries are visible to their tenant" on kb.kb_rerank_audit
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Audit entries are appended by their tenant" on kb.kb_rerank_audit
  for insert with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_audit from cyberos_app;
grant select, insert on kb.kb_rerank_audit to cyberos_app;

