"""SQL calls, always inside the caller's tenant transaction (:func:`.session.atenant_transaction`):
search, the result cache, the pair-score cache and the audit log."""
