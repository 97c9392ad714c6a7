"""What a policy reports about its decoding: ``DecodeStats`` (running counts over every chunk it predicted) and
``DecodeInfo`` (the last call's chunks: valid, ids generated, errors, latency)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class DecodeStats:
    """Running counts over every predicted chunk: nothing falls back silently."""

    chunks: int = 0
    invalid: int = 0  # chunks that did not decode (only possible with constrained=False)
    fallback_previous: int = 0  # ... replaced by the previously executed action, repeated
    fallback_zero: int = 0  # ... replaced by the normalised zero action (no previous action known)
    tokens: int = 0  # action ids generated for valid chunks

    @property
    def valid_rate(self) -> float:
        return 1.0 - self.invalid / self.chunks if self.chunks else 1.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "valid_rate": self.valid_rate}


@dataclass
class DecodeInfo:
    """About the last ``predict_action_chunk`` call, per chunk. Readable as attributes or keys (``info["valid"]``)."""

    valid: np.ndarray  # bool [B]
    tokens_per_chunk: np.ndarray  # int [B], action ids generated
    errors: list[str | None]
    latency_ms: float  # prompt building + decoding + detokenising, whole batch
    steps: int  # decoding steps (forward passes after the prefill)

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"{key!r}; DecodeInfo holds {', '.join(self.__dataclass_fields__)}")
        return getattr(self, key)
