-- 0020 down: kb.current_tenant() back to the setting alone (its 0019 body, which the layer
-- below head does not re-apply), the lookup and the mapping dropped, and every privilege of
-- kb_sql_reader and kb_access in this database revoked: a mapped login role that remains in
-- the cluster can neither connect here nor read anything. The roles are not dropped (roles
-- are cluster-wide: another database may use them).
create or replace function kb.current_tenant()
returns uuid
language sql
stable
parallel safe
security invoker
as $$
  select nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
$$;
drop function if exists kb.sql_access_tenant();
drop table if exists kb.sql_access;
do $$
begin
  execute format('revoke all on database %I from kb_sql_reader, kb_access', current_database());
end
$$;
revoke all on all tables in schema kb from kb_sql_reader, kb_access;
revoke all on all sequences in schema kb from kb_sql_reader, kb_access;
revoke all on all routines in schema kb from kb_sql_reader, kb_access;
revoke all on schema kb from kb_sql_reader, kb_access;
