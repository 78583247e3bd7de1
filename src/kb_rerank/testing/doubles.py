"""A base for cross-encoder test doubles (:class:`kb_rerank.models.CrossEncoder`): ready, named,
loads at once; a subclass writes ``ascore``."""

from __future__ import annotations


class ModelDouble:
    model_name = "test-double"
    ready = True

    async def ensure_loaded_async(self) -> bool:
        return self.ready
