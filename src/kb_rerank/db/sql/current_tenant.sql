-- The one accessor for the caller's tenant, on the hot path of every RLS check. Policies
-- call it as (select kb.current_tenant()) so that it is evaluated once per statement.
--
-- Two kinds of caller:
-- * A member of kb_sql_reader (a per-tenant SQL login: `kb-rerank sql-access grant`): the
--   tenant is the one kb.sql_access maps its login role to, and the auth.tenant_id setting
--   is IGNORED, so the session cannot widen its access by setting it. A member without a
--   mapping gets NULL: nothing (fail closed).
-- * Any other role (the service, the owner, the maintenance job, a superuser even when it
--   is a member): the setting. The service
--   sets `auth.tenant_id` per transaction (set_config(..., true)); after such a transaction
--   ends the setting reads '' rather than NULL, so both mean "no tenant". A malformed value
--   raises (invalid input syntax for type uuid): fail closed.
--
-- session_user, not current_user: inside a SECURITY DEFINER function (the searches run as
-- kb_search) current_user is the function's owner, and SET ROLE changes current_user too;
-- session_user is the login role and only a superuser can change it. The membership test
-- is a catalog lookup cached per backend, and the body has no sub-query, so the planner
-- inlines it: the service's path reads no table and calls no other SQL function.
create or replace function kb.sql_access_tenant()
returns uuid
language sql
stable
parallel safe
security definer
-- a definer so that no caller needs to read kb.sql_access; owned by kb_access, which reads
-- that table only, and only the session user's row (its policy)
set search_path = pg_catalog, kb, pg_temp
as $$
  select case
           -- a superuser counts as a member of every role: it keeps the setting
           when r.rolsuper then nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
           else (select a.tenant_id from kb.sql_access a where a.role_name = session_user)
         end
  from pg_catalog.pg_roles r where r.rolname = session_user
$$;
alter function kb.sql_access_tenant() owner to kb_access;
comment on function kb.sql_access_tenant() is
  'Tenant that kb.sql_access maps the session''s login role to (NULL when none); the setting for a superuser';

create or replace function kb.current_tenant()
returns uuid
language sql
stable
parallel safe
security invoker
as $$
  select case
           when pg_catalog.pg_has_role(session_user, 'kb_sql_reader', 'MEMBER') then kb.sql_access_tenant()
           else nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
         end
$$;
comment on function kb.current_tenant() is
  'Tenant of the current transaction: the mapped tenant of a kb_sql_reader login (kb.sql_access), '
  'else the setting auth.tenant_id; NULL when none';
