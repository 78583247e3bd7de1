-- kb.sql_access: which login role reads which tenant (`kb-rerank sql-access`). Written by
-- the owner only (a superuser or BYPASSRLS role: the CLI runs with the owner URL). Read by
-- kb_access alone, inside kb.sql_access_tenant(), and only the row of the session's own
-- login role: RLS enabled and forced, one SELECT policy for kb_access. No other role, the
-- app role and the readers included, has any privilege on it.
alter table kb.sql_access enable row level security;
alter table kb.sql_access force row level security;

drop policy if exists "Mappings are visible to their own login role" on kb.sql_access;
create policy "Mappings are visible to their own login role" on kb.sql_access
  for select to kb_access using (role_name = session_user);

revoke all on kb.sql_access from public, {{app_role}}, kb_sql_reader;
grant select on kb.sql_access to kb_access;
