"""BEAST: a clamped uniform B-spline per action dimension, control points quantised to uniform bins
(Zhou et al., "BEAST: B-spline Encoded Action Sequence Tokenizer", NeurIPS 2025).

    chunk [T, D] --ridge least squares on a fixed basis B [T, N]--> control points [N, D]
      --clip to [-bound, bound], uniform bins--> ids [N, D] --flatten control-point-major--> N * D ids
    ids --bin centres--> control points --B @ control points--> chunk [T, D]

The basis holds the N degree-p clamped uniform B-spline functions sampled at T equally spaced times over [0, 1],
so encoding is one matrix product (``encoder = (B^T B + ridge I)^-1 B^T``, ``[N, T]``) and decoding another. The
ids are ordered control point by control point (all D dims of control point 0, then of 1, ...), i.e. roughly
along time, like binning's time-major ids.

The paper bins control points over [-1, 1] (``bound=1``). A spline through data that reaches +-1 needs control
points beyond it, and clipping them dominated the error on real data (29% of control points clipped on
piper_grape, RMSE 0.015 against 0.004 at ``bound=1.5``), so by default ``fit`` sets the bound from the fitting
chunks' control points (their 99.9th percentile of ``|c|``, at least 1).

Vocabulary: ``n_bins`` ids; every chunk is exactly ``N * D`` ids. Any in-range ids decode, and a clamped spline
starts at its first and ends at its last control point, so decoded chunks are smooth by construction.
Round trip: a chunk inside the spline space (``B @ c`` with ``c`` in [-bound, bound]) comes back within
``bound / n_bins + bound * max_i sum_j |(encoder @ B - I)_ij|`` per value (half a bin per control point; the basis
rows are non-negative and sum to 1; the second term is the ridge's bias on control points within the bound, ~1e-5
by default). Other chunks are projected onto the space.
Control points outside ``[-bound, bound]`` are clipped to the edge bins, on the floats before the cast to ids, and
counted (a huge value clips, never wraps). Failure mode: a sequence of the wrong length or with an id >= n_bins is
invalid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.interpolate import BSpline

from .base import (
    CONFIG_NAME,
    MAX_ACTION_DIM,
    MAX_TIME_HORIZON,
    ActionTokenizer,
    DecodeMode,
    DecodeResult,
    as_chunk_batch,
    check_mode,
    check_saved,
    check_size,
    finish_decode,
)
from .binning import MAX_N_BINS, bin_centers, fixed_length_grid, uniform_bins
from .constraint import Constraint, fixed_length

# Control points are binned over [-bound, bound] in normalised units, where data lies in about [-1, 1]: a bound beyond
# this means un-normalised data (and a bin wider than any action), so it is refused.
MAX_BOUND = 1e3
MAX_RIDGE = 1.0  # relative to the Gram matrix's scale (1e-6 by default): beyond it the fit shrinks every chunk to 0


def bspline_basis(time_horizon: int, n_control_points: int, degree: int) -> np.ndarray:
    """``[T, N]``: the clamped uniform B-spline basis functions sampled at ``linspace(0, 1, T)``."""
    inner = np.linspace(0.0, 1.0, n_control_points - degree + 1)
    knots = np.concatenate([np.zeros(degree), inner, np.ones(degree)])  # N + degree + 1 knots
    t = np.linspace(0.0, 1.0, time_horizon)
    return BSpline.design_matrix(t, knots, degree).toarray()


class BEASTTokenizer(ActionTokenizer):
    name: ClassVar[str] = "beast"

    @dataclass(frozen=True)
    class Options:
        """``fit``'s options: ``BEASTTokenizer.fit(chunks, **asdict(BEASTTokenizer.Options()))`` is ``fit(chunks)``."""

        n_control_points: int = field(
            default=10, metadata={"help": "B-spline control points per dimension: ids per chunk = this x action_dim"}
        )
        degree: int = field(
            default=4, metadata={"help": "B-spline degree (4 in the paper); must be below n_control_points"}
        )
        n_bins: int = field(
            default=256, metadata={"help": "uniform bins over [-bound, bound] per control point (the vocabulary)"}
        )
        ridge: float = field(
            default=1e-6,
            metadata={"help": "ridge term of the least-squares fit, relative to the basis' Gram matrix scale"},
        )
        bound: float | None = field(
            default=None,
            metadata={
                "help": "control points are binned over [-bound, bound]; None: their 99.9th percentile |c| on"
                " the fitting chunks (at least 1); 1: the paper's"
            },
        )

    def __init__(
        self,
        *,
        time_horizon: int,
        action_dim: int,
        n_control_points: int = 10,
        degree: int = 4,
        n_bins: int = 256,
        ridge: float = 1e-6,
        bound: float = 1.0,
    ):
        super().__init__()
        for label, value, low in (
            ("time_horizon", time_horizon, 1),
            ("action_dim", action_dim, 1),
            ("n_control_points", n_control_points, 1),
            ("degree", degree, 0),
            ("n_bins", n_bins, 2),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
        if degree >= n_control_points:
            raise ValueError(
                f"degree {degree} needs more than {degree} control points, got n_control_points {n_control_points}; "
                f"raise n_control_points or lower degree"
            )
        if n_control_points > time_horizon:
            raise ValueError(
                f"n_control_points {n_control_points} is more than time_horizon {time_horizon}: the fit would be "
                f"underdetermined; use n_control_points <= {time_horizon}"
            )
        check_size("n_bins", n_bins, 2, MAX_N_BINS, "MAX_N_BINS")
        check_size("time_horizon", time_horizon, 1, MAX_TIME_HORIZON, "MAX_TIME_HORIZON")
        check_size("action_dim", action_dim, 1, MAX_ACTION_DIM, "MAX_ACTION_DIM")
        if not (np.isfinite(ridge) and 0 <= ridge <= MAX_RIDGE):
            raise ValueError(
                f"ridge must be a number in [0, {MAX_RIDGE:g}] (MAX_RIDGE), got {ridge!r}; 1e-6 is the default"
            )
        if not (np.isfinite(bound) and 0 < bound <= MAX_BOUND):
            raise ValueError(
                f"bound must be a positive number of at most {MAX_BOUND:g} (MAX_BOUND; control points of normalised "
                f"chunks lie within a few units), got {bound!r}; leave it unset to take it from the data"
            )
        self.time_horizon, self.action_dim = int(time_horizon), int(action_dim)
        self.n_control_points, self.degree, self.n_bins = int(n_control_points), int(degree), int(n_bins)
        self.ridge = float(ridge)
        self.bound = float(bound)

    @classmethod
    def fit(cls, chunks: np.ndarray, **options: Any) -> BEASTTokenizer:
        """Record ``[T, D]`` and, unless given, the control points' range; nothing is trained (``options``:
        ``BEASTTokenizer.Options``)."""
        arr = as_chunk_batch(chunks)
        o = cls.fit_options(options)
        bound = o.bound
        options = dict(n_control_points=o.n_control_points, degree=o.degree, n_bins=o.n_bins, ridge=o.ridge)
        tok = cls(time_horizon=arr.shape[1], action_dim=arr.shape[2], **options)
        if bound is None:
            bound = max(1.0, float(np.quantile(np.abs(tok.control_points(arr)), 0.999)))
            if bound > MAX_BOUND:
                raise ValueError(
                    f"the chunks' control points reach {bound:.3g}, beyond {MAX_BOUND:g} (MAX_BOUND): fit on "
                    "normalised chunks (about [-1, 1])"
                )
        return cls(time_horizon=arr.shape[1], action_dim=arr.shape[2], bound=bound, **options)

    @property
    def vocab_size(self) -> int:
        return self.n_bins

    @cached_property
    def basis(self) -> np.ndarray:
        """``[T, N]`` sampled basis functions (rows non-negative, summing to 1)."""
        return bspline_basis(self.time_horizon, self.n_control_points, self.degree)

    @cached_property
    def encoder(self) -> np.ndarray:
        """``[N, T]``: ``(B^T B + ridge * scale * I)^-1 B^T``, the ridge least-squares fit of control points."""
        gram = self.basis.T @ self.basis  # [N, N]
        reg = self.ridge * np.trace(gram) / self.n_control_points
        return np.linalg.solve(gram + reg * np.eye(self.n_control_points), self.basis.T)

    @property
    def bin_centers(self) -> np.ndarray:
        return self.bound * bin_centers(self.n_bins)

    def control_points(self, chunks: np.ndarray) -> np.ndarray:
        """``[B, N, D]`` fitted control points, before clipping and quantisation.

        Never NaN: a chunk whose fit overflows (values near the float limit) is fitted with each dimension scaled down
        by a power of two (exact; each dimension's fit is its own, so a huge dimension leaves the others' bits alone)
        and scaled back, so an out-of-range control point is +-inf with its sign, and clips to the edge bin.
        """
        arr = as_chunk_batch(chunks, time_horizon=self.time_horizon, action_dim=self.action_dim)
        with np.errstate(over="ignore", invalid="ignore"):
            cp = np.einsum("nt,btd->bnd", self.encoder, arr)
        bad = ~np.isfinite(cp).all(axis=(1, 2))
        if bad.any():
            s = np.ldexp(1.0, np.frexp(np.abs(arr[bad]).max(axis=1))[1] - 1)[:, None, :]  # [R, 1, D]
            with np.errstate(over="ignore"):
                cp[bad] = np.einsum("nt,btd->bnd", self.encoder, arr[bad] / s) * s
        return cp

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        cp = self.control_points(chunks)  # [B, N, D]
        with np.errstate(over="ignore"):
            u = cp / self.bound  # [-1, 1] inside the range; +-inf beyond the float range, clipped like the rest
        bins = uniform_bins(u, self.n_bins, self.encode_stats)
        return bins.reshape(len(cp), -1).tolist()  # control-point-major: [B, N * D]

    def decode(
        self, ids, time_horizon: int | None = None, action_dim: int | None = None, mode: DecodeMode = "mark"
    ) -> DecodeResult:
        check_mode(mode)
        t, d = self._fitted_shape(time_horizon, action_dim)
        grid, valid, errors = fixed_length_grid(
            ids, self.n_bins, self.n_control_points * d, f"{self.n_control_points} x {d}"
        )
        b = len(grid)
        cp = self.bin_centers[grid].reshape(b, self.n_control_points, d)
        actions = np.einsum("tn,bnd->btd", self.basis, cp)
        return finish_decode(actions, valid, errors, mode)

    def constraint(self, time_horizon: int | None = None, action_dim: int | None = None) -> Constraint:
        t, d = self._fitted_shape(time_horizon, action_dim)
        return fixed_length(self.n_bins, self.n_control_points * d)

    def _config(self) -> dict[str, Any]:
        return {
            "n_control_points": self.n_control_points,
            "degree": self.degree,
            "n_bins": self.n_bins,
            "ridge": self.ridge,
            "bound": self.bound,
            "time_horizon": self.time_horizon,
            "action_dim": self.action_dim,
        }

    SAVED_FIELDS: ClassVar[dict[str, str]] = {
        "n_control_points": "int>=1",
        "degree": "int>=0",
        "n_bins": "int>=2",
        "ridge": "number>=0",
        "bound": "number>0",
        "time_horizon": "int>=1",
        "action_dim": "int>=1",
    }

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> BEASTTokenizer:
        path = directory / CONFIG_NAME
        config = check_saved(config, path, cls.SAVED_FIELDS)
        try:
            return cls(**{k: config[k] for k in cls.SAVED_FIELDS})
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
