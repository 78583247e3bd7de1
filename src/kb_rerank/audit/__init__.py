"""The audit log: rows, the record step, chain verification and archive."""
