-- kb.record_outcome: the record step of a computed answer (kb_rerank/endpoints/runner.py) in ONE
-- statement: the result-cache row, the pair scores the model computed and the audit row,
-- so a miss writes everything in one round trip and one transaction.
--
--   tenant         the request's tenant. Set for this call only (transaction-local, and put
--                  back as it was before the function returns; on an error the transaction's
--                  abort does it), so the service calls it as one autocommit statement: its
--                  own transaction, no BEGIN / set_config / COMMIT round trips. A different
--                  tenant already set on the transaction is refused (the call never switches
--                  tenants).
--   generation, ttl_s
--                  the knowledge-base generation the answer was computed under, and the TTL
--                  of the cache row and of the pair scores.
--   cache_payload  the cache row's results_jsonb; NULL: the answer is not cached (a fallback,
--                  documents the guard had no time to inspect). The row's key, trace id and
--                  model are the audit row's (query_hash, source, trace_id, model).
--   pair_query_hash, pair_chunk_ids, pair_content_hashes, pair_scores
--                  the pair scores the model computed (NULL or empty arrays: none, as on a
--                  fallback), keyed by the audit row's model.
--   kind .. key_id the arguments of kb.audit_append, passed through unchanged: the MAC is
--                  computed by the service with its audit key (kb_rerank/audit/store.py).
--   claimant       the single-flight claim on the key this answer releases (kb.kb_rerank_inflight,
--                  kb_rerank/core/inflight.py); NULL: none. Released with the cache row, so a
--                  waiting process sees the row and the release at once.
-- Returns whether this call inserted the cache row, how many pair scores it inserted, and the
-- audit row's seq.
--
-- The writes keep the rules of the statements they replace (kb_rerank/cache/store.py,
-- pair_cache.py): delete the key's expired rows and those of older generations, then insert
-- with ON CONFLICT DO NOTHING (a live row written concurrently is kept). One statement, so
-- all or nothing: a failure in any part (the audit append's checks, a constraint, the
-- statement timeout) leaves no cache row, no pair score and no audit row.
--
-- SECURITY INVOKER: it does nothing the app role cannot do with its own grants (INSERT and
-- DELETE on the two caches and the single-flight claims under their RLS policies, EXECUTE on kb.audit_append). The audit
-- row is still written only by kb.audit_append (SECURITY DEFINER, owner kb_audit), which
-- fixes seq, prev_hash, row_hash and created_at; a row with a made-up MAC is stored as it
-- would be through kb.audit_append directly and is reported by `kb-rerank audit verify`.
-- search_path pinned anyway (pg_temp last).
create or replace function kb.record_outcome(
  tenant uuid,
  generation bigint,
  ttl_s double precision,
  cache_payload jsonb,
  pair_query_hash text,
  pair_chunk_ids uuid[],
  pair_content_hashes character[],
  pair_scores real[],
  kind text,
  severity smallint,
  source text,
  query_hash text,
  trace_id text,
  model text,
  candidate_count integer,
  returned_count integer,
  duration_ms real,
  detail text,
  mac text,
  nonce text,
  key_id text,
  claimant uuid,
  out cached boolean,
  out pairs integer,
  out audit_seq bigint
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_prev text := pg_catalog.current_setting('auth.tenant_id', true);
  v_set pg_catalog.uuid := kb.current_tenant();
  v_expires timestamptz;
  n bigint;
begin
  if record_outcome.tenant is null then
    raise exception 'kb.record_outcome: tenant is required' using errcode = '22023';
  end if;
  if v_set is not null and v_set <> record_outcome.tenant then
    raise exception 'kb.record_outcome: the transaction is set to another tenant'
      using errcode = '42501';
  end if;
  perform pg_catalog.set_config('auth.tenant_id', record_outcome.tenant::text, true);
  v_expires := now() + make_interval(secs => record_outcome.ttl_s);

  cached := false;
  if record_outcome.cache_payload is not null then
    delete from kb.kb_rerank_cache c
    where c.tenant_id = record_outcome.tenant and c.query_hash = record_outcome.query_hash::bpchar
      and c.source = record_outcome.source
      and (c.expires_at <= now() or c.generation < record_outcome.generation);
    insert into kb.kb_rerank_cache as c
      (cache_id, tenant_id, query_hash, source, generation, results_jsonb, cached_at, expires_at, trace_id, model)
    values (gen_random_uuid(), record_outcome.tenant, record_outcome.query_hash, record_outcome.source,
            record_outcome.generation, record_outcome.cache_payload, now(), v_expires,
            record_outcome.trace_id, record_outcome.model)
    on conflict on constraint kb_rerank_cache_tenant_id_query_hash_source_generation_key do nothing;
    get diagnostics n = row_count;
    cached := n = 1;
  end if;

  pairs := 0;
  if coalesce(cardinality(record_outcome.pair_chunk_ids), 0) > 0 then
    delete from kb.kb_rerank_pair_scores p
    using unnest(record_outcome.pair_chunk_ids, record_outcome.pair_content_hashes) as k(chunk_id, content_hash)
    where p.tenant_id = record_outcome.tenant and p.model = record_outcome.model
      and p.query_hash = record_outcome.pair_query_hash::bpchar
      and p.chunk_id = k.chunk_id and p.content_hash = k.content_hash
      and (p.expires_at <= now() or p.generation < record_outcome.generation);
    insert into kb.kb_rerank_pair_scores as p
      (tenant_id, model, query_hash, generation, chunk_id, content_hash, score, expires_at)
    select record_outcome.tenant, record_outcome.model, record_outcome.pair_query_hash, record_outcome.generation,
           k.chunk_id, k.content_hash, k.score, v_expires
    from unnest(record_outcome.pair_chunk_ids, record_outcome.pair_content_hashes, record_outcome.pair_scores)
         as k(chunk_id, content_hash, score)
    on conflict on constraint kb_rerank_pair_scores_pkey do nothing;
    get diagnostics n = row_count;
    pairs := n;
  end if;

  select a.seq into audit_seq
  from kb.audit_append(record_outcome.kind, record_outcome.severity, record_outcome.source,
                       record_outcome.query_hash, record_outcome.trace_id, record_outcome.model,
                       record_outcome.candidate_count, record_outcome.returned_count,
                       record_outcome.duration_ms, record_outcome.detail, record_outcome.mac,
                       record_outcome.nonce, record_outcome.key_id) as a;

  if record_outcome.claimant is not null then
    delete from kb.kb_rerank_inflight i
    where i.tenant_id = record_outcome.tenant and i.query_hash = record_outcome.query_hash::bpchar
      and i.source = record_outcome.source and i.generation = record_outcome.generation
      and i.claimant = record_outcome.claimant;
  end if;
  perform pg_catalog.set_config('auth.tenant_id', coalesce(v_prev, ''), true);
end
$$;
comment on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                      text, smallint, text, text, text, text, integer, integer, real, text,
                                      text, text, text, uuid) is
  'The record step of a computed answer in one statement: cache row (unless NULL), pair scores, and the audit row through kb.audit_append; sets the tenant for the call only';
revoke all on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                         text, smallint, text, text, text, text, integer, integer, real, text,
                                         text, text, text, uuid) from public;
grant execute on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                            text, smallint, text, text, text, text, integer, integer, real, text,
                                            text, text, text, uuid) to {{app_role}};
