-- kb.kb_rerank_inflight: claims on misses being computed (migration 0013_single_flight).
-- RLS enabled and forced: a tenant sees and writes only its own claims (fail closed). The
-- app role inserts and deletes claims; it cannot update one (a claim is never extended: it
-- is released or it expires). A SQL caller holding the app role can only claim keys of its
-- own tenant, and a follower waits at most until the claim's expiry capped by its own budget,
-- so a forged claim delays nobody else.
alter table kb.kb_rerank_inflight enable row level security;
alter table kb.kb_rerank_inflight force row level security;

drop policy if exists rerank_inflight_rls on kb.kb_rerank_inflight;
create policy rerank_inflight_rls on kb.kb_rerank_inflight
  using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_inflight from public, {{app_role}};
grant select, insert, delete on kb.kb_rerank_inflight to {{app_role}};
