-- After a downgrade: the frozen .down.sql files of 0015, 0014, 0011 and 0010 grant the objects
-- they recreate to cyberos_app, the former default app role, by name. Those privileges are
-- moved to the configured app role ({{app_role}}), so the service keeps working below head
-- whatever its role; run by kb_rerank.db.layer.regrant_after_downgrade. Idempotent.
do $$
declare
  former oid := to_regrole('cyberos_app');
  app oid := to_regrole('{{app_role}}');
  r record;
begin
  if former is null or app is null or former = app or to_regnamespace('kb') is null then
    return;
  end if;
  for r in
    select case c.relkind when 'S' then 'sequence' else 'table' end as kind, c.oid::regclass::text as obj,
           a.privilege_type as priv
      from pg_catalog.pg_class c, aclexplode(c.relacl) a
     where a.grantee = former and c.relnamespace = to_regnamespace('kb')
    union all
    select 'function', p.oid::regprocedure::text, a.privilege_type
      from pg_catalog.pg_proc p, aclexplode(p.proacl) a
     where a.grantee = former and p.pronamespace = to_regnamespace('kb')
    union all
    select 'schema', quote_ident(n.nspname), a.privilege_type
      from pg_catalog.pg_namespace n, aclexplode(n.nspacl) a
     where a.grantee = former and n.nspname in ('kb', 'public')
  loop
    execute format('grant %s on %s %s to {{app_role}}', r.priv, r.kind, r.obj);
    execute format('revoke %s on %s %s from cyberos_app', r.priv, r.kind, r.obj);
  end loop;
end
$$;
