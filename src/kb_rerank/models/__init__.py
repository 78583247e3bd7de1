"""The models: the cross-encoder (:mod:`.cross_encoder`, :mod:`.onnx`, :mod:`.remote`) and the
embedders (:mod:`.embedders`)."""

from __future__ import annotations

from typing import Protocol, Sequence


class CrossEncoder(Protocol):
    """What the request path needs of a cross-encoder: every backend
    (:class:`.cross_encoder.Reranker`, :class:`.onnx.OnnxReranker`,
    :class:`.remote.RemoteReranker`) and every test double has all four."""

    @property
    def model_name(self) -> str: ...

    @property
    def ready(self) -> bool: ...

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score in 0..1 a passage, in input order."""

    async def ensure_loaded_async(self) -> bool:
        """Load the model when it is not ready (never raises); whether it is ready now."""
