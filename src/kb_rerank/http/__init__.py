"""HTTP layer: the Litestar app factory and lifespan, authentication and the per-address limit,
error mapping, request/response Structs, telemetry (trace ids, Prometheus) and one module per route.
The only package that imports Litestar."""
