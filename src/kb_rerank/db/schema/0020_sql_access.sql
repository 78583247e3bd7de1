-- 0020 SQL access for one tenant. A direct SQL caller (a BI tool, an analyst) gets a login
-- role of its own, member of the NOLOGIN group kb_sql_reader, and mapped here to ONE
-- tenant: kb.current_tenant() returns the mapped tenant for a member of kb_sql_reader and
-- ignores the auth.tenant_id setting for it, so the caller cannot widen its access from
-- inside the session. The service role keeps reading auth.tenant_id.
-- Versioned: runs once (Alembic revision 0020_sql_access). The group's grants, the lookup
-- function and the new kb.current_tenant() are in the idempotent layer.

do $$
begin
  -- The group every mapped login role is a member of; its privileges (read-only, under
  -- RLS) are granted in the idempotent layer. NOLOGIN and no attribute: a member gains
  -- nothing but those grants.
  if to_regrole('kb_sql_reader') is null then
    create role kb_sql_reader nologin nosuperuser nocreatedb nocreaterole inherit nobypassrls;
  end if;
  -- Owner of kb.sql_access_tenant() (SECURITY DEFINER): reads kb.sql_access and nothing
  -- else, so that no caller needs to read the mapping itself.
  if to_regrole('kb_access') is null then
    create role kb_access nologin nosuperuser nocreatedb nocreaterole noinherit nobypassrls;
  end if;
end
$$;

-- login role -> the one tenant it may read. Written by `kb-rerank sql-access grant|revoke`
-- (the owner URL); no other role reads or writes it (kb_access reads it inside the lookup).
-- created: whether `grant` created the login role (then `revoke` drops it too).
create table kb.sql_access (
  role_name name primary key,
  tenant_id uuid not null,
  created boolean not null default false,
  granted_at timestamptz not null default now()
);
create index sql_access_tenant on kb.sql_access (tenant_id);
comment on table kb.sql_access is
  'Login roles (members of kb_sql_reader) mapped to the one tenant kb.current_tenant() returns for them';
revoke all on kb.sql_access from public;
