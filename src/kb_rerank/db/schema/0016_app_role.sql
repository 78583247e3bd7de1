-- 0016 app role: the service's login role is a setting, KB_APP_ROLE (default cyberos_app),
-- rendered here and in the idempotent layer as {{app_role}}: a quoted identifier that
-- kb_rerank.sqlfiles has checked ([a-z_][a-z0-9_]*, not a definer role). Roles are
-- cluster-wide: two kb-rerank databases on one cluster each name their own app role, and
-- only that role (and the owner, and superusers) may connect to its database.
-- Versioned: runs once (Alembic revision 0016_app_role). Every grant to the app role is in
-- the idempotent layer (sql/functions, sql/policies, sql/views), applied after this file for
-- the configured role only.

do $$
declare
  app oid := to_regrole('{{app_role}}');
  old oid := to_regrole('cyberos_app');
  r record;
begin
  -- Created when missing, with the attributes 0001 gives cyberos_app: never owner, never
  -- superuser, never BYPASSRLS.
  if app is null then
    create role {{app_role}} login nosuperuser nocreatedb nocreaterole noinherit nobypassrls;
    app := to_regrole('{{app_role}}');
  end if;
  -- An existing role is taken as it is, unless RLS would not bind it or it could grant
  -- itself more: then the configuration names the wrong role.
  select rolname, rolsuper, rolbypassrls, rolcreaterole into r from pg_catalog.pg_roles where oid = app;
  if r.rolsuper or r.rolbypassrls or r.rolcreaterole then
    raise exception 'KB_APP_ROLE=% is a superuser, BYPASSRLS or CREATEROLE role: row-level security would not'
                    ' bind the service; name a role of its own', r.rolname;
  end if;
  if app = (select datdba from pg_catalog.pg_database where datname = current_database())
     or app = (select oid from pg_catalog.pg_roles where rolname = current_user) then
    raise exception 'KB_APP_ROLE=% owns this database or runs this migration: the app role is never the owner',
                    r.rolname;
  end if;

  -- CONNECT: the app role, not PUBLIC (by default every role of the cluster may connect to
  -- every database, so another database's app role could connect here). The owner and
  -- superusers keep theirs; any other login role (a DBA's maintenance or audit role) needs
  -- GRANT CONNECT of its own.
  execute format('revoke connect on database %I from public', current_database());
  execute format('grant connect on database %I to {{app_role}}', current_database());

  -- A database that served cyberos_app until now and is configured with another role: the
  -- layer (applied next) grants the new role; cyberos_app keeps nothing here. REVOKE, not
  -- DROP OWNED: that would also revoke cyberos_app's privileges on the cluster's other
  -- databases.
  if old is not null and old <> app then
    execute format('revoke all on database %I from cyberos_app', current_database());
    revoke all on all tables in schema kb from cyberos_app;
    revoke all on all sequences in schema kb from cyberos_app;
    revoke all on all routines in schema kb from cyberos_app;
    revoke all on schema kb from cyberos_app;
    revoke all on schema public from cyberos_app;
    if to_regclass('public.kb_alembic_version') is not null then
      revoke all on public.kb_alembic_version from cyberos_app;
    end if;
  end if;
end
$$;
