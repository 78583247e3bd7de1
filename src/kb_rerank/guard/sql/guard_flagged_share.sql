-- DBA view: the share of each tenant's chunks flagged for prompt
-- injection at ingestion, by the layer that flagged them (kb.chunks.injection_reasons:
-- 'fired:patterns' / 'fired:classifier', 'classifier_p=<p>' whenever the learned detector
-- ran; see docs/guardrails.md), by the strength of the evidence (kb.chunks.injection_strong:
-- what the default policy excludes; the doubtful ones it demotes) and by a person's review
-- (kb.chunks.injection_review, `kb-rerank guard allow` / `block`; migration 0018).
--
-- Who sees what: the view is security_invoker and reads kb.chunks through a SECURITY
-- INVOKER function, so kb.chunks' row-level security (enabled and forced) applies to
-- whoever queries it: the app role sees only the tenant of its transaction (nothing without
-- one); a role exempt from RLS (a superuser, or BYPASSRLS) sees every tenant.
--
-- Why a function under the view: a view records a dependency on every column it reads, and
-- the frozen downgrade of 0003_context_guardrails drops kb.chunks.injection_* columns
-- without CASCADE, so a plain view would make any downgrade through 0003 fail. A
-- LANGUAGE sql function with a string body records no column dependency; after such a
-- downgrade the view errors when queried until the next upgrade to head re-applies it.
--
-- Columns:
--   chunks                 chunks of the tenant
--   flagged                chunks with injection_flag
--   flagged_share          flagged / chunks
--   flagged_by_patterns    flagged chunks the patterns flagged ('fired:patterns', or a verdict
--                          stored without the classifier, where only the patterns could flag)
--   flagged_by_classifier  flagged chunks the learned detector flagged ('fired:classifier');
--                          a chunk both layers flagged counts in both columns
--   classifier_scored      chunks whose stored verdict includes the classifier's probability
--                          (the others were judged before the classifier shipped, or with another embedder:
--                          `kb-rerank guard scan` re-scores them)
--   spam_flagged           chunks flagged as keyword-stuffed
--   last_ingested_at       newest chunk's created_at
--   flagged_strong         flagged chunks with strong evidence (injection_strong)
--   flagged_doubtful       flagged chunks without it (flagged_strong + flagged_doubtful = flagged)
--   reviewed_allowed       chunks a person allowed (a false positive: kept at its rank under
--                          every policy), flagged or not
--   reviewed_blocked       chunks a person blocked (treated as strong evidence), flagged or not
--
-- The view and its function are dropped and created again (a function's result columns
-- cannot be changed in place): the grants below are applied with them.
drop view if exists kb.guard_flagged_share;
drop function if exists kb.guard_flagged_share_rows();
create function kb.guard_flagged_share_rows()
returns table (tenant_id uuid, chunks bigint, flagged bigint, flagged_share double precision,
               flagged_by_patterns bigint, flagged_by_classifier bigint, classifier_scored bigint,
               spam_flagged bigint, last_ingested_at timestamptz, flagged_strong bigint,
               flagged_doubtful bigint, reviewed_allowed bigint, reviewed_blocked bigint)
language sql
stable
security invoker
as $$
  select s.tenant_id, s.chunks, s.flagged, s.flagged::float8 / nullif(s.chunks, 0),
         s.flagged_by_patterns, s.flagged_by_classifier, s.classifier_scored, s.spam_flagged, s.last_ingested_at,
         s.flagged_strong, s.flagged - s.flagged_strong, s.reviewed_allowed, s.reviewed_blocked
  from (
    select c.tenant_id,
           pg_catalog.count(*) as chunks,
           pg_catalog.count(*) filter (where c.injection_flag) as flagged,
           pg_catalog.count(*) filter (where c.injection_flag and ('fired:patterns' = any (c.injection_reasons)
                                        or not exists (select from pg_catalog.unnest(c.injection_reasons) r
                                                       where r like 'classifier\_p=%'))) as flagged_by_patterns,
           pg_catalog.count(*) filter (where c.injection_flag
                                        and 'fired:classifier' = any (c.injection_reasons)) as flagged_by_classifier,
           pg_catalog.count(*) filter (where exists (select from pg_catalog.unnest(c.injection_reasons) r
                                                     where r like 'classifier\_p=%')) as classifier_scored,
           pg_catalog.count(*) filter (where c.spam_flag) as spam_flagged,
           pg_catalog.max(c.created_at) as last_ingested_at,
           pg_catalog.count(*) filter (where c.injection_flag and c.injection_strong) as flagged_strong,
           pg_catalog.count(*) filter (where c.injection_review = 'allow') as reviewed_allowed,
           pg_catalog.count(*) filter (where c.injection_review = 'block') as reviewed_blocked
    from kb.chunks c
    group by c.tenant_id
  ) s
$$;
comment on function kb.guard_flagged_share_rows() is
  'Rows of kb.guard_flagged_share (security invoker: kb.chunks RLS applies to the caller)';
revoke all on function kb.guard_flagged_share_rows() from public;
grant execute on function kb.guard_flagged_share_rows() to {{app_role}};

create view kb.guard_flagged_share with (security_invoker = true) as
  select * from kb.guard_flagged_share_rows();
comment on view kb.guard_flagged_share is
  'Chunks flagged for prompt injection per tenant, by layer, evidence and review (RLS applies: the app role sees its own tenant only)';

grant select on kb.guard_flagged_share to {{app_role}};
