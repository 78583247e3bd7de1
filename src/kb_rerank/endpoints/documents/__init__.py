"""``GET /v1/kb/documents``."""
