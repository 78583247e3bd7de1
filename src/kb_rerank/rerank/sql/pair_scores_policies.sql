-- kb.kb_rerank_pair_scores: tenant rows, RLS enabled and forced (the owner is subject to it
-- too). Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). Append-only for the app:
-- SELECT, INSERT, DELETE; no UPDATE grant and no UPDATE policy (an expired pair score is
-- deleted, then a new one inserted with ON CONFLICT DO NOTHING).
alter table kb.kb_rerank_pair_scores enable row level security;
alter table kb.kb_rerank_pair_scores force row level security;

drop policy if exists "Pair scores are visible to their tenant" on kb.kb_rerank_pair_scores;
drop policy if exists "Pair scores are inserted by their tenant" on kb.kb_rerank_pair_scores;
drop policy if exists "Pair scores are deleted by their tenant" on kb.kb_rerank_pair_scores;
create policy "Pair scores are visible to their tenant" on kb.kb_rerank_pair_scores
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Pair scores are inserted by their tenant" on kb.kb_rerank_pair_scores
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Pair scores are deleted by their tenant" on kb.kb_rerank_pair_scores
  for delete using (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_pair_scores from {{app_role}};
grant select, insert, delete on kb.kb_rerank_pair_scores to {{app_role}};
