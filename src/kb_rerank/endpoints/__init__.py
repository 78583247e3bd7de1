"""The endpoints: one folder each (route, flow), the request runner they share, their request and response types."""
