-- kb.kb_rerank_cache: the tenant policy, rewritten once-per-statement and fail-closed
-- (same meaning: a tenant sees and writes only its own rows). Append-only for the app:
-- SELECT, INSERT, DELETE; no UPDATE (an expired row is deleted, then a new one inserted).
alter table kb.kb_rerank_cache enable row level security;
alter table kb.kb_rerank_cache force row level security;

drop policy if exists rerank_cache_rls on kb.kb_rerank_cache;
create policy rerank_cache_rls on kb.kb_rerank_cache
  using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_cache from {{app_role}};
grant select, insert, delete on kb.kb_rerank_cache to {{app_role}};
