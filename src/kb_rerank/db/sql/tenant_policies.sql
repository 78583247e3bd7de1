-- kb.apply_tenant_policies: the one rule of a tenant table, applied to each of them by
-- db/sql/tenant_tables.sql (one line a table).
--
-- The rule: row-level security enabled and FORCED (the owner is subject to it too); each
-- policy compares tenant_id with (select kb.current_tenant()), evaluated once per statement
-- (the caller's auth.tenant_id, or a SQL reader's mapped tenant: db/sql/current_tenant.sql);
-- with no tenant set that is NULL and nothing matches (fail closed). The app role holds
-- exactly app_privileges on the table, nothing else, and PUBLIC nothing.
--
--   tbl             the table
--   noun            the policies' names: '<noun> are visible to their tenant' (select),
--                   '<noun> are inserted by / updated by / deleted by their tenant'
--   commands        the commands that get a policy of their own: select and delete check the
--                   row read (using), insert the row written (with check), update both
--   app_privileges  the app role's privileges (default: the commands); a command with a
--                   policy but no privilege is one another role (a definer's owner) runs
--   names           a policy's name where it is not the noun's ({"insert": "..."})
--   one_policy      instead of one policy a command: one policy of that name for every
--                   command (using and with check), commands then being empty
--
-- Idempotent (each policy is dropped if it exists and created again), so the layer can run
-- it on every upgrade. Policies of other names on the table are left as they are (a table
-- with a rule of its own adds it in its capability's file).
-- SECURITY INVOKER: run by the migrating owner; it changes only tables its caller owns. A
-- function called with select rather than a procedure: every kb routine then has a result
-- type, which the catalog checks read.
create or replace function kb.apply_tenant_policies(
  tbl regclass,
  noun text,
  commands text[],
  app_privileges text[] default null,
  names jsonb default '{}',
  one_policy text default null
)
returns void
language plpgsql
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  cmd text;
  pname text;
  verb constant jsonb := '{"select": "are visible to", "insert": "are inserted by",
                           "update": "are updated by", "delete": "are deleted by"}';
  tenant constant text := 'tenant_id = (select kb.current_tenant())';
begin
  if one_policy is not null and cardinality(commands) > 0 then
    raise exception 'apply_tenant_policies(%): one_policy or commands, not both', tbl;
  end if;
  foreach cmd in array commands || coalesce(app_privileges, '{}') loop
    if not verb ? cmd then
      raise exception 'apply_tenant_policies(%): % is not select, insert, update or delete', tbl, cmd;
    end if;
  end loop;

  execute format('alter table %s enable row level security', tbl);
  execute format('alter table %s force row level security', tbl);

  if one_policy is not null then
    execute format('drop policy if exists %I on %s', one_policy, tbl);
    execute format('create policy %I on %s using (%s) with check (%s)', one_policy, tbl, tenant, tenant);
  end if;
  foreach cmd in array commands loop
    pname := coalesce(names ->> cmd, format('%s %s their tenant', noun, verb ->> cmd));
    execute format('drop policy if exists %I on %s', pname, tbl);
    execute format('create policy %I on %s for %s %s', pname, tbl, cmd,
                   case cmd when 'insert' then format('with check (%s)', tenant)
                            when 'update' then format('using (%s) with check (%s)', tenant, tenant)
                            else format('using (%s)', tenant) end);
  end loop;

  execute format('revoke all on %s from public, {{app_role}}', tbl);
  if cardinality(coalesce(app_privileges, commands)) > 0 then
    execute format('grant %s on %s to {{app_role}}', array_to_string(coalesce(app_privileges, commands), ', '), tbl);
  end if;
end
$$;
revoke execute on function kb.apply_tenant_policies(regclass, text, text[], text[], jsonb, text) from public;
comment on function kb.apply_tenant_policies(regclass, text, text[], text[], jsonb, text) is
  'Row-level security forced on a tenant table, one policy per command on tenant_id = kb.current_tenant(), '
  'and the app role''s privileges on it; idempotent (the layer applies it on every upgrade)';
-- kb_stats applies it to the pg_textsearch engine's per-tenant partitions, which it creates and
-- owns (kb.lexical_bm25_partition, retrieval/sql/lexical_engine.sql)
grant execute on function kb.apply_tenant_policies(regclass, text, text[], text[], jsonb, text) to kb_stats;
