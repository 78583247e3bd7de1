"""The development and demo constants: the fixed, public JWT secret of
``kb-rerank serve --dev`` and the demo tenant. Below the CLI and the HTTP app, which both
read them, so that neither imports the other."""

from __future__ import annotations

from uuid import UUID

# `kb-rerank serve --dev` only: a fixed, public secret (>= 32 bytes, as HS256 wants).
DEV_JWT_SECRET = "kb-rerank-dev-secret-do-not-use-in-production"
# The tenant of `kb-rerank demo`, of `kb-rerank search` by default and of the playground's dev token.
DEMO_TENANT = UUID("00000000-0000-4000-8000-000000000001")
