"""One module per route: each parses its body into its request Struct and runs its flow
(:mod:`kb_rerank.pipeline`) through :func:`kb_rerank.http.serve.serve`."""
