"""``/healthz``, ``/readyz``, ``/metrics``."""
