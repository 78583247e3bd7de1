"""``POST /v1/kb/context``."""
