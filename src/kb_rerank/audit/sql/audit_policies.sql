-- kb.kb_rerank_audit, kb.audit_checkpoints, kb.audit_heads: their row-level security, tenant
-- policies and the app role's privileges (SELECT on the entries, none on the others) are the
-- tenant rule (db/sql/tenant_tables.sql); the policies bind kb_audit too (it does not bypass
-- RLS). Append-only: no UPDATE, DELETE or TRUNCATE for anyone but the owner, and no policy
-- that would allow them. Written only through kb.audit_append (SECURITY DEFINER, owner kb_audit).
revoke all on kb.kb_rerank_audit from kb_audit;
grant select, insert on kb.kb_rerank_audit to kb_audit;
-- audit_id's default (0015: a sequence, the table being partitioned)
revoke all on sequence kb.kb_rerank_audit_audit_id_seq from public, {{app_role}}, kb_audit;
grant usage on sequence kb.kb_rerank_audit_audit_id_seq to kb_audit;

-- The month partitions and the default one (0015): reached only through the parent, whose
-- policies and grants apply to rows read or written through it. Directly, no role but the
-- owner has any privilege, and RLS is forced on each (no policy: nothing visible), so a
-- grant given by mistake still shows nothing. kb.audit_add_month does the same for the
-- partitions it creates.
do $$
declare
  p regclass;
begin
  for p in select i.inhrelid::regclass from pg_catalog.pg_inherits i
           where i.inhparent = 'kb.kb_rerank_audit'::regclass
  loop
    execute format('alter table %s enable row level security', p);
    execute format('alter table %s force row level security', p);
    execute format('revoke all on %s from public, {{app_role}}, kb_audit', p);
  end loop;
end
$$;

-- kb.audit_checkpoints (0015): written by `kb-rerank audit archive` (a superuser or
-- BYPASSRLS owner), read by kb.audit_verify (SECURITY INVOKER): a tenant's checkpoints are
-- visible to the owner inside that tenant's transaction (`audit verify --tenant`). The app
-- role has no privilege.
revoke all on kb.audit_checkpoints from kb_audit;

-- kb.audit_heads: each tenant's last seq and row_hash, locked by kb.audit_append to
-- serialise a tenant's appends. Only kb_audit reaches it; the app role has no privilege, so
-- it can neither read nor lock another tenant's head.
revoke all on kb.audit_heads from kb_audit;
grant select, insert, update on kb.audit_heads to kb_audit;

