"""SQL calls: all the SQL of the request path and of the CLI, one module per table or job.
Most run inside the caller's tenant transaction (:func:`.session.atenant_transaction`):
search, the result cache, the pair-score cache, the audit log, curation lists, guard
reviews, term blocks. A few run outside any tenant, as the role their job needs:
schema_state (revision and layer version: migrations and /readyz), cache_eviction (the
maintenance role), audit_archive (the owner)."""
