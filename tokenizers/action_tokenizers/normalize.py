"""Normalisers: raw actions (or states) <-> the normalised space tokenizers work in.

* ``quantile``: q01 -> -1 and q99 -> +1 per dimension (the FAST paper's choice; robust to outliers).
* ``mean_std``: (x - mean) / std.
* ``identity``: unchanged.
Normalising never clips, so it is exactly invertible (up to float rounding); tokenizers clip and count.
A dimension whose range is (near) zero maps to 0 and back to its constant value.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .io import read_json, write_json

NORM_MODES = ("quantile", "mean_std", "identity")
_EPS = 1e-8
# Offsets and scales beyond this (in the data's units) are refused: a decoded action, normalised values of up to a few
# thousand times the scale, would overflow float32 (and a robot would be sent inf) long before any real robot's units
# reach it.
MAX_STATISTIC = 1e9
FORMAT_VERSION = 1  # files without a format_version were written before it was recorded: version 1


@dataclass(frozen=True)
class Normalizer:
    mode: str
    offset: np.ndarray  # per-dimension value that maps to 0
    scale: np.ndarray  # per-dimension half-range (quantile) or std (mean_std)

    def __post_init__(self) -> None:
        if self.mode not in NORM_MODES:
            close = difflib.get_close_matches(str(self.mode), NORM_MODES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown normalisation mode {self.mode!r}{hint}; choose one of {', '.join(NORM_MODES)}")
        offset = np.asarray(self.offset, dtype=np.float64).reshape(-1)
        scale = np.asarray(self.scale, dtype=np.float64).reshape(-1)
        if offset.shape != scale.shape:
            raise ValueError(f"offset and scale must have the same length, got {offset.shape} and {scale.shape}")
        if not (np.isfinite(offset).all() and np.isfinite(scale).all()):
            raise ValueError("normaliser statistics contain NaN or inf; recompute the dataset statistics")
        for name, values in (("offset", offset), ("scale", scale)):
            if values.size and np.abs(values).max() > MAX_STATISTIC:
                i = int(np.argmax(np.abs(values)))
                raise ValueError(
                    f"normaliser {name} {values[i]:g} (dimension {i}) is beyond +-{MAX_STATISTIC:g} (MAX_STATISTIC): "
                    "decoded actions would overflow; recompute the dataset statistics from actions in robot units"
                )
        if (scale < 0).any():
            raise ValueError(
                f"normaliser scale must be >= 0 per dimension (it would flip the actions), got {scale.tolist()}; "
                "check that q99 >= q01 (or std >= 0) in the statistics"
            )
        # A constant dimension would divide by zero: map it to 0 instead (and back to the constant).
        scale = np.where(np.abs(scale) < _EPS, 1.0, scale)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "scale", scale)

    @property
    def dim(self) -> int:
        return len(self.offset)

    # --- construction --------------------------------------------------------------------------------------
    @classmethod
    def identity(cls, dim: int) -> Normalizer:
        return cls("identity", np.zeros(dim), np.ones(dim))

    @classmethod
    def from_stats(cls, stats: dict[str, Any], mode: str = "quantile") -> Normalizer:
        """From one feature's entry of a LeRobot ``meta/stats.json`` (keys q01/q99 or mean/std)."""
        need = {"quantile": ("q01", "q99"), "mean_std": ("mean", "std"), "identity": ("mean",)}.get(mode)
        if need is None:
            return cls(mode, np.zeros(1), np.ones(1))  # raises the unknown-mode error
        missing = [k for k in need if k not in stats]
        if missing:
            raise ValueError(
                f"stats lack {', '.join(missing)} needed for {mode!r} normalisation (have {sorted(stats)}); "
                "recompute the dataset statistics or pick another mode"
            )
        if mode == "quantile":
            lo, hi = np.asarray(stats["q01"], float), np.asarray(stats["q99"], float)
            return cls(mode, (hi + lo) / 2, (hi - lo) / 2)
        if mode == "mean_std":
            return cls(mode, np.asarray(stats["mean"], float), np.asarray(stats["std"], float))
        return cls.identity(np.asarray(stats["mean"]).size)

    @classmethod
    def fit(cls, x: np.ndarray, mode: str = "quantile") -> Normalizer:
        """From raw data ``[..., D]``."""
        flat = np.asarray(x, dtype=np.float64)
        if flat.ndim < 1 or flat.size == 0:
            raise ValueError("cannot fit a normaliser on empty data")
        flat = flat.reshape(-1, flat.shape[-1])
        if not np.isfinite(flat).all():
            raise ValueError("cannot fit a normaliser on data with NaN or inf; clean the data first")
        stats = {
            "q01": np.quantile(flat, 0.01, axis=0),
            "q99": np.quantile(flat, 0.99, axis=0),
            "mean": flat.mean(axis=0),
            "std": flat.std(axis=0),
        }
        return cls.from_stats(stats, mode)

    # --- use -----------------------------------------------------------------------------------------------
    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"expected last dimension {self.dim}, got shape {x.shape}")
        return x

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return (self._check(x) - self.offset) / self.scale

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        return self._check(x) * self.scale + self.offset

    # --- files ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "mode": self.mode,
            "offset": self.offset.tolist(),
            "scale": self.scale.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        try:
            offset = np.asarray(data["offset"], float)
            scale = np.asarray(data["scale"], float)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"normaliser data is incomplete or malformed ({err!r}); save it again") from None
        if offset.ndim != 1 or scale.ndim != 1 or offset.size == 0:
            raise ValueError(
                f"normaliser data is malformed: offset and scale must be non-empty lists of numbers, got shapes "
                f"{offset.shape} and {scale.shape}; save it again"
            )
        small = np.flatnonzero(np.abs(scale) < _EPS)
        if len(small):  # a constant dimension is saved with scale 1: a smaller one was written by hand or damaged
            i = int(small[0])
            raise ValueError(
                f"scale {scale[i]:g} (dimension {i}) is below {_EPS:g}, which no saved normaliser holds (a constant "
                "dimension is saved with scale 1); save it again, or recompute the dataset statistics"
            )
        return cls(data.get("mode"), offset, scale)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Normalizer:
        """Load a file ``save`` wrote; any problem is one ``ValueError`` naming the file and the fix."""
        data = read_json(Path(path), "normaliser", format_version=FORMAT_VERSION, assume_version=1)
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"normaliser {path}: {err}") from None
