"""``GET /playground``: the search playground."""
