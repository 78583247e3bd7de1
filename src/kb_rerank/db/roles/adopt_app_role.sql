-- The default app role was cyberos_app and is kb_app. Run before the idempotent layer when the
-- service's role is the default one (kb_rerank.db.layer.apply_idempotent); idempotent.
-- A database that cyberos_app serves (it holds CONNECT here, which 0016_app_role granted) keeps
-- its role under the new name: the role is renamed, so its grants, its SCRAM password and
-- its open sessions carry over, and `kb-rerank migrate` with the new default just works; a
-- role of the former name is created again, without login or privileges.
-- Roles are cluster-wide, so nothing is renamed, and the upgrade stops changing nothing, when
-- cyberos_app also serves another database of this cluster or a role named like the new
-- default exists already: then KB_APP_ROLE=cyberos_app keeps this database's role.
do $$
declare
  former_name constant text := 'cyberos_app';
  former oid := to_regrole(former_name);
  app oid := to_regrole('{{app_role}}');
  app_name text := trim(both '"' from '{{app_role}}');
  others text;
begin
  if former is null or not exists (
      select from pg_catalog.pg_database d, aclexplode(d.datacl) a
      where d.datname = current_database() and a.grantee = former and a.privilege_type = 'CONNECT') then
    return;  -- not a database the former default serves
  end if;
  if app is not null then
    if exists (select from pg_catalog.pg_database d, aclexplode(d.datacl) a
               where d.datname = current_database() and a.grantee = app and a.privilege_type = 'CONNECT') then
      return;  -- served by the new role as well: nothing to adopt
    end if;
    raise exception 'this database''s app role is % (the former default) and a role % exists already on this'
                    ' cluster: set KB_APP_ROLE=% to keep this database''s role', former_name, app_name, former_name;
  end if;
  select string_agg(d.datname, ', ' order by d.datname) into others
    from pg_catalog.pg_database d, aclexplode(d.datacl) a
    where d.datname <> current_database() and a.grantee = former and a.privilege_type = 'CONNECT';
  if others is not null then
    raise exception 'this database''s app role is % (the former default), which also serves % on this'
                    ' cluster: renaming it to % would cut those off; set KB_APP_ROLE=% to keep it',
                    former_name, others, app_name, former_name;
  end if;
  execute format('alter role %I rename to %I', former_name, app_name);
  -- The former name stays a role that cannot log in and holds nothing, as 0001 leaves it on a
  -- fresh cluster: the frozen down files name it.
  execute format('create role %I nologin nosuperuser nocreatedb nocreaterole noinherit nobypassrls', former_name);
  raise notice 'app role % renamed to % (the new default KB_APP_ROLE)', former_name, app_name;
end
$$;
