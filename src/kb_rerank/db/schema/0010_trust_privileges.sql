-- 0010 trust (privileges): versioned, run once by Alembic revision 0010_trust.
-- The functions, grants and policies that use what this file creates are idempotent files
-- re-applied right after it (sql/functions, sql/policies).

-- Roles are cluster-wide, so they are created only when missing. Each SECURITY DEFINER
-- function is owned by a role that can do only what that function needs, and that owns
-- nothing but functions:
--   kb_search  search functions: SELECT on chunks, documents and the statistics (0001)
--   kb_stats   statistics triggers and champion lists: SELECT on chunks; write on
--              kb.term_stats, kb.corpus_stats, kb.term_tops only (BYPASSRLS: those tables
--              have no write policy, and the rows come from RLS-checked statements)
--   kb_audit   kb.audit_append: SELECT, INSERT on the audit log, kb.audit_heads (not
--              BYPASSRLS: the tenant policies bind it)
--   kb_maint   cache eviction (0002)
do $$
begin
  if not exists (select from pg_roles where rolname = 'kb_stats') then
    create role kb_stats nologin nosuperuser nocreatedb nocreaterole noinherit bypassrls;
  end if;
  if not exists (select from pg_roles where rolname = 'kb_audit') then
    create role kb_audit nologin nosuperuser nocreatedb nocreaterole noinherit nobypassrls;
  end if;
end
$$;

-- The audit chain keyed with a secret the database does not hold (kb_rerank/store/audit.py):
-- the service's HMAC-SHA256 of the row, its random nonce and the key's fingerprint. Rows
-- written before this revision have none (NULL); every later row has all three.
alter table kb.kb_rerank_audit
  add column mac text check (mac ~ '^[0-9a-f]{64}$'),
  add column nonce text check (nonce ~ '^[0-9a-f]{32}$'),
  add column key_id text check (key_id ~ '^[0-9a-f]{16}$'),
  add constraint kb_rerank_audit_mac_all_or_none
    check ((mac is null) = (nonce is null) and (mac is null) = (key_id is null));
-- a replayed row (same MAC) is refused
create unique index kb_rerank_audit_tenant_mac_key on kb.kb_rerank_audit (tenant_id, mac);

-- Each tenant's chain head, the row kb.audit_append locks (replaces an advisory lock that
-- any role could take). RLS, policies, grants: audit/sql/audit_policies.sql.
create table kb.audit_heads (
  tenant_id uuid primary key,
  seq       bigint not null check (seq >= 0),
  row_hash  char(64) not null
);
-- Seeded from the existing chains (forced RLS is lifted for this statement only, so that a
-- non-superuser owner sees every tenant's rows).
alter table kb.kb_rerank_audit no force row level security;
insert into kb.audit_heads (tenant_id, seq, row_hash)
select distinct on (a.tenant_id) a.tenant_id, a.seq, a.row_hash
from kb.kb_rerank_audit a
order by a.tenant_id, a.seq desc;
alter table kb.kb_rerank_audit force row level security;

-- The old, unkeyed append (SECURITY INVOKER, advisory lock) and the champion-list lock key
-- go; their replacements are in audit/sql/audit_append.sql and 04_term_tops.sql.
drop function if exists kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text);
drop function if exists kb.term_tops_lock_key(uuid);
