-- kb.kb_generation: a tenant's knowledge-base generation (migration 0010_trust_cache).
-- RLS enabled and forced. The app role may only read its own tenant's row (fail closed:
-- no tenant set, nothing visible); only kb_generation (owner of the trigger function
-- kb.bump_generation, cache/sql/kb_generation.sql) writes, through its own policy.
alter table kb.kb_generation enable row level security;
alter table kb.kb_generation force row level security;

drop policy if exists "Generation is visible to its tenant" on kb.kb_generation;
drop policy if exists "Generation is written by the bump trigger" on kb.kb_generation;
create policy "Generation is visible to its tenant" on kb.kb_generation
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Generation is written by the bump trigger" on kb.kb_generation
  for all to kb_generation using (true) with check (true);

revoke all on kb.kb_generation from public, {{app_role}}, kb_generation;
grant select on kb.kb_generation to {{app_role}};
grant usage on schema kb to kb_generation;
grant select, insert, update on kb.kb_generation to kb_generation;
