-- 0015: the audit log partitioned by month, with signed chain checkpoints.
--
-- kb.kb_rerank_audit becomes `partition by range (created_at)`: one partition per calendar
-- month (UTC), kb.kb_rerank_audit_YYYY_MM, and a default partition for rows no month
-- partition covers. `kb-rerank audit partitions` creates the months ahead
-- (kb.audit_add_month), `kb-rerank audit archive --before YYYY-MM` drops whole old months
-- after writing, for every tenant with rows in them, a checkpoint: the seq and row_hash of
-- the tenant's last dropped row, MAC'd with the audit key (which the database never holds).
-- kb.audit_verify starts each chain from its checkpoint; `kb-rerank audit verify` checks the
-- checkpoints' MACs. docs/operations.md.
--
-- Keys: a partitioned table needs the partition key in every unique key, and every key in
-- kb leads with tenant_id (tests/test_schema_keys.py): primary key (tenant_id, audit_id,
-- created_at), unique (tenant_id, seq, created_at). They are unique within a month only:
-- seq stays unique per tenant because kb.audit_append takes it from kb.audit_heads under
-- that row's lock (and kb.audit_verify reports a duplicate as a break). The replay index
-- (tenant_id, mac) can no longer be unique across months: kb.audit_append looks the MAC up
-- under the same lock instead (the index is kept, not unique).
--
-- audit_id: a sequence default instead of an identity column (identity columns on
-- partitioned tables need PostgreSQL 17; kb-rerank supports 15). Only kb.audit_append
-- inserts (owner kb_audit: USAGE on the sequence, audit/sql/audit_policies.sql).
--
-- The rows are copied in; the functions and the views typed on the old table's row are
-- dropped here and re-created by the idempotent layer at the end of the upgrade.

drop view if exists kb.audit_summary;
drop view if exists kb.cache_hit_ratio;
drop function if exists kb.audit_verify();
drop function if exists kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text);
drop function if exists kb.audit_row_hash(kb.kb_rerank_audit);

alter table kb.kb_rerank_audit rename to kb_rerank_audit_0014;
alter sequence kb.kb_rerank_audit_audit_id_seq rename to kb_rerank_audit_0014_audit_id_seq;
-- the copy must see every tenant's rows (forced RLS binds a non-superuser owner)
alter table kb.kb_rerank_audit_0014 no force row level security;
alter table kb.kb_rerank_audit_0014 rename constraint kb_rerank_audit_pkey to kb_rerank_audit_0014_pkey;
alter table kb.kb_rerank_audit_0014 rename constraint kb_rerank_audit_tenant_id_seq_key to kb_rerank_audit_0014_tenant_id_seq_key;
alter index kb.kb_rerank_audit_tenant_mac_key rename to kb_rerank_audit_0014_tenant_mac_key;
alter index kb.rerank_audit_tenant_created_idx rename to kb_rerank_audit_0014_tenant_created_idx;

create sequence kb.kb_rerank_audit_audit_id_seq as bigint;

create table kb.kb_rerank_audit (
  audit_id        bigint not null default nextval('kb.kb_rerank_audit_audit_id_seq'),
  tenant_id       uuid not null,
  seq             bigint not null constraint kb_rerank_audit_seq_check check (seq >= 1),
  kind            text not null constraint kb_rerank_audit_kind_check
                    check (kind in ('served','cache_hit','fallback','rejected')),
  severity        smallint not null constraint kb_rerank_audit_severity_check check (severity between 0 and 3),
  source          text not null constraint kb_rerank_audit_source_check
                    check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation','caller_documents')),
  query_hash      char(64) not null,
  trace_id        text not null,
  model           text,
  candidate_count integer not null default 0 constraint kb_rerank_audit_candidate_count_check check (candidate_count >= 0),
  returned_count  integer not null default 0 constraint kb_rerank_audit_returned_count_check check (returned_count >= 0),
  duration_ms     real,
  detail          text,
  created_at      timestamptz not null default clock_timestamp(),
  prev_hash       char(64) not null,
  row_hash        char(64) not null,
  mac             text constraint kb_rerank_audit_mac_check check (mac ~ '^[0-9a-f]{64}$'),
  nonce           text constraint kb_rerank_audit_nonce_check check (nonce ~ '^[0-9a-f]{32}$'),
  key_id          text constraint kb_rerank_audit_key_id_check check (key_id ~ '^[0-9a-f]{16}$'),
  constraint kb_rerank_audit_mac_all_or_none
    check ((mac is null) = (nonce is null) and (mac is null) = (key_id is null)),
  constraint kb_rerank_audit_pkey primary key (tenant_id, audit_id, created_at),
  constraint kb_rerank_audit_tenant_id_seq_key unique (tenant_id, seq, created_at)
) partition by range (created_at);
alter sequence kb.kb_rerank_audit_audit_id_seq owned by kb.kb_rerank_audit.audit_id;
create index kb_rerank_audit_tenant_mac_idx on kb.kb_rerank_audit (tenant_id, mac);
create index rerank_audit_tenant_created_idx on kb.kb_rerank_audit (tenant_id, created_at);
comment on table kb.kb_rerank_audit is
  'Audit log, one hash chain per tenant, partitioned by month of created_at (docs/operations.md, retention)';

create table kb.kb_rerank_audit_default partition of kb.kb_rerank_audit default;

-- a month partition for every month that holds rows (none on a new install)
do $$
declare
  m date;
begin
  for m in select distinct date_trunc('month', a.created_at at time zone 'UTC')::date
           from kb.kb_rerank_audit_0014 a order by 1
  loop
    execute format('create table kb.%I partition of kb.kb_rerank_audit for values from (%L) to (%L)',
                   'kb_rerank_audit_' || to_char(m, 'YYYY_MM'),
                   (m::timestamp at time zone 'UTC'), ((m + interval '1 month')::timestamp at time zone 'UTC'));
  end loop;
end
$$;

insert into kb.kb_rerank_audit
select * from kb.kb_rerank_audit_0014 order by tenant_id, seq;
select setval('kb.kb_rerank_audit_audit_id_seq', coalesce(max(audit_id), 0) + 1, false) from kb.kb_rerank_audit;
drop table kb.kb_rerank_audit_0014;

-- Signed chain checkpoints: (tenant, seq) was the tenant's last row before the archived
-- months, with that row_hash; mac = HMAC-SHA256 under the audit key of the canonical form
-- in kb_rerank/store/audit.py (checkpoint_canonical). Written by `kb-rerank audit archive`
-- (the owner, a superuser or BYPASSRLS role). RLS, grants: audit/sql/audit_policies.sql.
create table kb.audit_checkpoints (
  tenant_id       uuid not null,
  seq             bigint not null check (seq >= 1),
  row_hash        char(64) not null,
  archived_before date not null,
  created_at      timestamptz not null default clock_timestamp(),
  mac             text not null check (mac ~ '^[0-9a-f]{64}$'),
  key_id          text not null check (key_id ~ '^[0-9a-f]{16}$'),
  primary key (tenant_id, seq)
);
comment on table kb.audit_checkpoints is
  'Signed audit chain checkpoints: a tenant''s last archived row (seq, row_hash), where its remaining chain starts';
