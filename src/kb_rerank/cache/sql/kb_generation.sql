-- kb.bump_generation(): the trigger function that moves a tenant's knowledge-base generation
-- (kb.kb_generation, migration 0010_trust_cache) on every statement that changes its
-- documents or chunks. The generation is part of every cache key (kb_rerank.cache.store,
-- kb_rerank.rerank.pair_cache), so a delete, a changed document or a re-ingest makes the tenant's
-- cached answers and pair scores miss from the moment it commits.
--
-- Why SECURITY DEFINER: the app role may read its tenant's generation but must never set
-- or lower it (it could otherwise keep serving an answer that holds a deleted document's
-- text). So kb.kb_generation is written only here, as its owner kb_generation: a nologin
-- role, no BYPASSRLS, whose only privileges are SELECT, INSERT, UPDATE on that table (and
-- USAGE on schema kb). The tenants bumped are those of the rows the statement changed
-- (its transition tables: rows that RLS has already checked, so an app-role statement only
-- holds the current tenant's rows and bumps that tenant alone); the function takes no
-- argument and returns nothing. A trigger function cannot be called directly, and EXECUTE
-- is granted to nobody.
-- search_path is pinned to pg_catalog then pg_temp (pg_temp last: no temporary object can
-- shadow a name used here); every kb object is schema-qualified.
-- Lock order: the bump is the first row lock a statement takes after its own rows (the
-- trigger names sort before the statistics triggers'), and tenants are bumped in tenant
-- order, so two writers of one tenant queue on its generation row instead of deadlocking.
create or replace function kb.bump_generation()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  tenants uuid[];
begin
  if tg_op = 'TRUNCATE' then
    -- only the owner can truncate: every tenant's data is gone
    update kb.kb_generation set generation = generation + 1;
    return null;
  elsif tg_op = 'INSERT' then
    tenants := array(select distinct n.tenant_id from new_rows n);
  elsif tg_op = 'DELETE' then
    tenants := array(select distinct o.tenant_id from old_rows o);
  else
    tenants := array(select o.tenant_id from old_rows o union select n.tenant_id from new_rows n);
  end if;
  insert into kb.kb_generation as g (tenant_id, generation)
  select t, 1 from unnest(tenants) as t order by t
  on conflict (tenant_id) do update set generation = g.generation + 1;
  return null;
end
$$;
alter function kb.bump_generation() owner to kb_generation;
revoke all on function kb.bump_generation() from public;
comment on function kb.bump_generation() is
  'Trigger: bump the knowledge-base generation of the tenants whose documents/chunks a statement changed (SECURITY DEFINER, owner kb_generation; see cache/sql/kb_generation.sql)';

-- Statement-level: one bump per statement (not per row). Transition tables cannot serve a
-- trigger of several events, hence one trigger per event.
drop trigger if exists documents_bump_generation_insert on kb.documents;
drop trigger if exists documents_bump_generation_update on kb.documents;
drop trigger if exists documents_bump_generation_delete on kb.documents;
drop trigger if exists documents_bump_generation_truncate on kb.documents;
create trigger documents_bump_generation_insert after insert on kb.documents
  referencing new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_update after update on kb.documents
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_delete after delete on kb.documents
  referencing old table as old_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_truncate after truncate on kb.documents
  for each statement execute function kb.bump_generation();

drop trigger if exists chunks_bump_generation_insert on kb.chunks;
drop trigger if exists chunks_bump_generation_update on kb.chunks;
drop trigger if exists chunks_bump_generation_delete on kb.chunks;
drop trigger if exists chunks_bump_generation_truncate on kb.chunks;
create trigger chunks_bump_generation_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_update after update on kb.chunks
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_truncate after truncate on kb.chunks
  for each statement execute function kb.bump_generation();
