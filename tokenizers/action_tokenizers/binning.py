"""Per-dimension uniform binning (RT-2 / OpenVLA): one id per value, ``T x D`` ids per chunk.

Vocabulary: ``n_bins`` ids; bin ``k`` covers ``[-1 + k w, -1 + (k + 1) w)`` with ``w = 2 / n_bins``.
Round trip: values inside [-1, 1] come back within half a bin (``1 / n_bins``); values outside are clipped to
the edge bin and counted in ``encode_stats``. Ids are flattened time-major (step 0's D values, then step 1's).
Failure mode: a sequence of the wrong length or with an id >= n_bins is invalid.

``uniform_bins``, ``bin_centers`` and ``fixed_length_grid`` are the binning itself, shared with BEAST (which bins its
control points the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .base import (
    CONFIG_NAME,
    MAX_ACTION_DIM,
    MAX_TIME_HORIZON,
    MAX_VOCAB_SIZE,
    ActionTokenizer,
    DecodeMode,
    DecodeResult,
    EncodeStats,
    as_chunk_batch,
    as_id_batch,
    check_mode,
    check_saved,
    check_size,
    finish_decode,
)
from .constraint import Constraint, fixed_length

MAX_N_BINS = MAX_VOCAB_SIZE  # bins per value, the vocabulary (RT-2 and OpenVLA use 256)


def uniform_bins(u: np.ndarray, n_bins: int, stats: EncodeStats) -> np.ndarray:
    """Values ``u`` [B, ...] -> int64 bin ids [B, ...] of ``n_bins`` uniform bins over [-1, 1]; values outside (+-inf
    included) clip to the edge bins and are counted in ``stats``, with the chunks and values seen."""
    outside = (u < -1.0) | (u > 1.0)
    stats.chunks += len(u)
    stats.values += u.size
    stats.clipped += int(outside.sum())
    bins = np.floor((np.clip(u, -1.0, 1.0) + 1.0) * (n_bins / 2.0)).astype(np.int64)
    return np.minimum(bins, n_bins - 1)  # a value at exactly 1 falls in the last bin


def bin_centers(n_bins: int) -> np.ndarray:
    """The centre of each of ``n_bins`` uniform bins over [-1, 1], [n_bins]."""
    return -1.0 + (np.arange(n_bins) + 0.5) * (2.0 / n_bins)


def fixed_length_grid(ids: Any, n_bins: int, n: int, spelled: str) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Id sequences that must each hold ``n`` ids in [0, n_bins) -> ``(grid [B, n], valid [B], errors)``. An invalid
    row is repaired: ids out of range dropped, then cut to ``n`` or padded with the middle bin; its error names the
    first id out of range, else the count (``spelled`` says what ``n`` is, e.g. "10 x 4")."""
    flat, counts = as_id_batch(ids)
    b = len(counts)
    valid = counts == n
    errors: list[str | None] = [None if ok else f"{c} ids, expected {n} (= {spelled})" for ok, c in zip(valid, counts)]
    bad = (flat < 0) | (flat >= n_bins)
    if valid.all() and not bad.any():
        return flat.reshape(b, n), valid, errors
    row_of = np.repeat(np.arange(b), counts)
    for i in np.unique(row_of[bad]):
        valid[i] = False
        errors[i] = f"id {int(flat[(row_of == i) & bad][0])} is outside [0, {n_bins})"
    grid = np.full((b, n), n_bins // 2, dtype=np.int64)
    for i, row in enumerate(np.split(flat, np.cumsum(counts)[:-1])):
        row = row[(row >= 0) & (row < n_bins)][:n]
        grid[i, : len(row)] = row
    return grid, valid, errors


class BinningTokenizer(ActionTokenizer):
    name: ClassVar[str] = "bin"
    time_local: ClassVar[bool] = True
    learns_from_data: ClassVar[bool] = False

    @dataclass(frozen=True)
    class Options:
        """``fit``'s options: ``BinningTokenizer.fit(chunks, **asdict(BinningTokenizer.Options()))`` is ``fit(chunks)``."""

        n_bins: int = field(default=256, metadata={"help": "uniform bins over [-1, 1] per value (the vocabulary)"})

    def __init__(self, n_bins: int = 256, time_horizon: int | None = None, action_dim: int | None = None):
        super().__init__()
        self.n_bins = check_size("n_bins", n_bins, 2, MAX_N_BINS, "MAX_N_BINS")
        if time_horizon is not None:
            time_horizon = check_size("time_horizon", time_horizon, 1, MAX_TIME_HORIZON, "MAX_TIME_HORIZON")
        if action_dim is not None:
            action_dim = check_size("action_dim", action_dim, 1, MAX_ACTION_DIM, "MAX_ACTION_DIM")
        self.time_horizon = time_horizon
        self.action_dim = action_dim

    @classmethod
    def fit(cls, chunks: np.ndarray, **options: Any) -> BinningTokenizer:
        """Binning learns nothing from the data; ``fit`` checks it and records ``[T, D]`` (``options``:
        ``BinningTokenizer.Options``)."""
        arr = as_chunk_batch(chunks)
        return cls(n_bins=cls.fit_options(options).n_bins, time_horizon=arr.shape[1], action_dim=arr.shape[2])

    @classmethod
    def unfitted(cls, time_horizon: int, action_dim: int, **options: Any) -> BinningTokenizer:
        """What ``fit`` gives for chunks ``[time_horizon, action_dim]``: binning learns nothing from them."""
        return cls(n_bins=cls.fit_options(options).n_bins, time_horizon=time_horizon, action_dim=action_dim)

    @property
    def vocab_size(self) -> int:
        return self.n_bins

    @property
    def bin_centers(self) -> np.ndarray:
        return bin_centers(self.n_bins)

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        arr = as_chunk_batch(chunks, time_horizon=self.time_horizon, action_dim=self.action_dim)
        return uniform_bins(arr, self.n_bins, self.encode_stats).reshape(arr.shape[0], -1).tolist()

    def prefix_ids(self, actions: np.ndarray) -> list[list[int]]:
        """The first ``d`` steps' ids, ``d * D`` per chunk: binning is time-local, each id one value of one step."""
        arr = np.asarray(actions, dtype=np.float64)
        if arr.ndim != 3 or (self.action_dim is not None and arr.shape[2] != self.action_dim):
            raise ValueError(f"committed actions are [B, d, {self.action_dim or 'D'}], got shape {arr.shape}")
        if self.time_horizon is not None and arr.shape[1] > self.time_horizon:
            raise ValueError(f"{arr.shape[1]} committed actions, more than a chunk's {self.time_horizon}")
        if not np.isfinite(arr).all():
            raise ValueError("committed actions must be finite")
        return uniform_bins(arr, self.n_bins, EncodeStats()).reshape(len(arr), -1).tolist()  # not the encoder's count

    def decode(
        self, ids, time_horizon: int | None = None, action_dim: int | None = None, mode: DecodeMode = "mark"
    ) -> DecodeResult:
        check_mode(mode)
        t, d = self._resolve_shape(time_horizon, action_dim)
        grid, valid, errors = fixed_length_grid(ids, self.n_bins, t * d, f"{t} x {d}")
        actions = self.bin_centers[grid].reshape(len(grid), t, d)
        return finish_decode(actions, valid, errors, mode)

    def constraint(self, time_horizon: int | None = None, action_dim: int | None = None) -> Constraint:
        t, d = self._resolve_shape(time_horizon, action_dim)
        return fixed_length(self.n_bins, t * d)

    def _config(self) -> dict[str, Any]:
        return {"n_bins": self.n_bins, "time_horizon": self.time_horizon, "action_dim": self.action_dim}

    SAVED_FIELDS: ClassVar[dict[str, str]] = {"n_bins": "int>=2", "time_horizon": "int>=1?", "action_dim": "int>=1?"}

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> BinningTokenizer:
        config = check_saved(config, directory / CONFIG_NAME, cls.SAVED_FIELDS, {"n_bins": (MAX_N_BINS, "MAX_N_BINS")})
        return cls(config["n_bins"], config.get("time_horizon"), config.get("action_dim"))
