-- kb.kb_generation: a tenant's knowledge-base generation. Its row-level security, the tenant's
-- read policy and the app role's SELECT are the tenant rule (db/sql/tenant_tables.sql); only
-- kb_generation (owner of the trigger function kb.bump_generation, cache/sql/kb_generation.sql)
-- writes, through its own policy.
drop policy if exists "Generation is written by the bump trigger" on kb.kb_generation;
create policy "Generation is written by the bump trigger" on kb.kb_generation
  for all to kb_generation using (true) with check (true);

revoke all on kb.kb_generation from kb_generation;
grant usage on schema kb to kb_generation;
grant select, insert, update on kb.kb_generation to kb_generation;
