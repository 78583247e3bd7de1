"""``GET /schema``: the API reference page."""
