"""The one interface every action tokenizer implements, and the checks and file handling they share.

A tokenizer maps normalised action chunks ``[B, T, D]`` (time_horizon T, action_dim D) to lists of integer ids in
``[0, vocab_size)`` and back. Saved tokenizers are a directory holding ``action_tokenizer.json`` (the type, a
format number and the options) plus whatever tensors the tokenizer needs as safetensors: nothing is executed on load.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from .constraint import Constraint

# Re-exported for ``vla/`` until it imports them from ``action_tokenizers.io`` (their home).
from .io import atomic_directory, write_json

CONFIG_NAME = "action_tokenizer.json"
FORMAT_VERSION = 1
# Bounds on the sizes every tokenizer reads from a saved file or is given to fit. Beyond them a tokenizer would ask the
# allocator for more than any machine has (or overflow an index), so they are refused up front with the bound named.
MAX_TIME_HORIZON = 1024  # steps per chunk (ALOHA's 50 Hz chunks are 50-100)
MAX_ACTION_DIM = 256  # action dimensions (a two-arm humanoid has ~50)
MAX_VOCAB_SIZE = 1 << 16  # ids in a tokenizer's vocabulary (PaliGemma gives actions a few thousand of its ids)
DecodeMode = Literal["mark", "strict", "repair"]
DECODE_MODES = ("mark", "strict", "repair")


class DecodeError(ValueError):
    """Raised by strict decoding: names the chunk and the reason it cannot be decoded."""

    def __init__(self, index: int, reason: str):
        self.index = index
        self.reason = reason
        super().__init__(
            f"chunk {index}: {reason}. Decode with mode='mark' to get a validity flag per chunk instead, "
            f"or mode='repair' to pad/truncate; constrained decoding (tok.constraint(...)) never produces this."
        )


@dataclass
class DecodeResult:
    """Decoded chunks plus a validity flag per chunk.

    ``actions``: float ``[B, T, D]``. Rows whose ids were invalid are NaN in mode ``"mark"`` (so they cannot be
    used by accident) and padded/truncated in mode ``"repair"``. ``valid[i]`` says whether ids ``i`` decoded as is;
    ``errors[i]`` is the reason when not.
    """

    actions: np.ndarray
    valid: np.ndarray
    errors: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def valid_rate(self) -> float:
        return float(self.valid.mean()) if len(self.valid) else 1.0


@dataclass
class EncodeStats:
    """What encoding had to change: values outside the representable range are clipped *and counted*."""

    chunks: int = 0
    values: int = 0
    clipped: int = 0
    dropped: int = 0  # byte-level FAST only: values the BPE model could not represent

    @property
    def clipped_rate(self) -> float:
        return self.clipped / self.values if self.values else 0.0


class ActionTokenizer(ABC):
    """Base class: ``fit`` / ``encode`` / ``decode`` / ``constraint`` / ``save_pretrained``."""

    name: ClassVar[str]  # registry name, e.g. "fast"
    # Each id spells values of one action step, so a chunk's first steps fix its first ids (``prefix_ids``)
    time_local: ClassVar[bool] = False
    # ``fit`` learns from the chunks; a tokenizer that learns nothing is built without data by ``unfitted``
    learns_from_data: ClassVar[bool] = True

    time_horizon: int | None
    action_dim: int | None

    def __init__(self) -> None:
        self.encode_stats = EncodeStats()
        # What fit chose from the chunks: option -> (value, why), for an option left to the data (FAST's
        # vocab_size="auto"). Printed by whoever fitted it; the tokenizer's own files hold the values chosen.
        self.fit_choices: dict[str, tuple[Any, str]] = {}

    # --- the interface -------------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def fit(cls, chunks: np.ndarray, **options: Any) -> ActionTokenizer:
        """Build a tokenizer from normalised chunks ``[N, T, D]``; ``options`` are the fields of ``cls.Options``, the
        one place their names and defaults are declared."""

    @classmethod
    def fit_options(cls, given: dict[str, Any]) -> Any:
        """``cls.Options`` with ``given`` (``fit``'s keyword options) over its defaults; a name it lacks is refused
        with the ones it has."""
        known = [f.name for f in dataclasses.fields(cls.Options)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise TypeError(f"{cls.__name__}.fit has no option {unknown[0]!r}; its options: {', '.join(known)}")
        return cls.Options(**given)

    @classmethod
    def unfitted(cls, time_horizon: int, action_dim: int, **options: Any) -> ActionTokenizer:
        """The tokenizer for chunks ``[time_horizon, action_dim]`` built without data (``options``: ``fit``'s), for
        one that learns nothing from the chunks (``learns_from_data`` False); the others refuse."""
        raise ValueError(
            f"the {cls.name} tokenizer learns from action chunks: fit it on data ({cls.__name__}.fit(chunks)) or load "
            "a saved one; only a tokenizer that learns nothing (bin) is built without data"
        )

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Ids are in ``[0, vocab_size)``."""

    @abstractmethod
    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        """``[T, D]`` or ``[B, T, D]`` normalised actions -> B lists of ids."""

    @abstractmethod
    def decode(
        self,
        ids: Sequence[Sequence[int]] | np.ndarray,
        time_horizon: int | None = None,
        action_dim: int | None = None,
        mode: DecodeMode = "mark",
    ) -> DecodeResult:
        """B lists of ids -> ``DecodeResult`` with ``actions [B, T, D]`` and ``valid [B]``."""

    @abstractmethod
    def constraint(self, time_horizon: int | None = None, action_dim: int | None = None) -> Constraint:
        """A state machine whose accepted sequences all decode to exactly ``[T, D]``."""

    @abstractmethod
    def _config(self) -> dict[str, Any]:
        """JSON-serialisable options that (with a learned tokenizer's own weights file) rebuild this tokenizer."""

    @classmethod
    @abstractmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> ActionTokenizer:
        """Rebuild from ``_config()`` and the files ``_save_files`` wrote."""

    def _save_files(self, directory: Path) -> None:
        """Write extra files (tensors, BPE) into ``directory`` (a temporary one, renamed afterwards)."""

    # --- shared behaviour ----------------------------------------------------------------------------------
    def prefix_ids(self, actions: np.ndarray) -> list[list[int]]:
        """The ids a chunk must begin with when its first ``d`` actions are known (``actions`` normalised ``[B, d,
        D]``, ``d`` <= T): committed-prefix decoding, for tokenizers whose ids are time-local (each id spells values
        of one step). Refused here: the ids of FAST (DCT coefficients), BEAST (B-spline control points) and FSQ (a
        learned encoder) each depend on the whole chunk."""
        raise ValueError(
            f"{self.name} ids mix the chunk's steps, so a chunk's first actions fix none of its ids: committed-prefix "
            "decoding needs a time-local tokenizer (bin)"
        )

    def tokens_per_chunk(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        return np.array([len(row) for row in ids])

    def choices(self) -> list[str]:
        """What ``fit`` chose from the data, one line each (``"vocab_size = 128: why"``); empty when nothing was."""
        return [f"{name} = {value}: {why}" for name, (value, why) in self.fit_choices.items()]

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Save atomically: everything is written to a temporary sibling, then renamed into place. What ``fit``
        chose from the data is kept beside the options (``fit_choices``: name -> {value, why}), for the record."""
        config = {"type": self.name, "format_version": FORMAT_VERSION, **self._config()}
        if self.fit_choices:
            config["fit_choices"] = {k: {"value": v, "why": why} for k, (v, why) in self.fit_choices.items()}
        with atomic_directory(directory) as tmp:
            write_json(tmp / CONFIG_NAME, config)
            self._save_files(tmp)
        return Path(directory)

    def _resolve_shape(self, time_horizon: int | None, action_dim: int | None) -> tuple[int, int]:
        t = time_horizon if time_horizon is not None else self.time_horizon
        d = action_dim if action_dim is not None else self.action_dim
        if t is None or d is None:
            raise ValueError(
                "time_horizon and action_dim are unknown: pass them, e.g. decode(ids, time_horizon=10, action_dim=7)"
            )
        if int(t) < 1 or int(d) < 1:
            raise ValueError(f"time_horizon and action_dim must be positive, got {t} and {d}")
        return int(t), int(d)

    def _fitted_shape(self, time_horizon: int | None, action_dim: int | None) -> tuple[int, int]:
        """The shape asked for, which must be the fitted one (a tokenizer whose ids spell a whole chunk of it)."""
        t, d = self._resolve_shape(time_horizon, action_dim)
        if (t, d) != (self.time_horizon, self.action_dim):
            raise ValueError(
                f"this {self.name} tokenizer spells chunks of [{self.time_horizon}, {self.action_dim}], not [{t}, {d}]; "
                "fit one for that shape"
            )
        return t, d

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._config().items() if not isinstance(v, (list, dict)))
        return f"{type(self).__name__}({fields}, vocab_size={self.vocab_size})"


# --- input checks ------------------------------------------------------------------------------------------
def as_chunk_batch(
    chunks: Any, *, time_horizon: int | None = None, action_dim: int | None = None, what: str = "chunks"
) -> np.ndarray:
    """Validate and return float64 ``[B, T, D]``; raise ``ValueError`` saying what is wrong and what to do."""
    try:
        arr = np.asarray(chunks)
        if arr.dtype.kind != "c":
            arr = arr.astype(np.float64, copy=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} must be a numeric array [T, D] or [B, T, D]: {err}") from None
    if arr.dtype.kind == "c":  # the cast to float would drop the imaginary part with only numpy's warning
        raise ValueError(
            f"{what} are complex ({arr.dtype}); tokenizers take real actions: pass chunks.real if the imaginary part "
            "is meant to be dropped"
        )
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise ValueError(f"{what} must have shape [T, D] or [B, T, D], got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{what} is an empty batch (shape {arr.shape}); pass at least one chunk")
    if arr.shape[1] == 0 or arr.shape[2] == 0:
        raise ValueError(f"{what} has an empty time or action axis (shape {arr.shape})")
    if not (np.isfinite(arr.min()) and np.isfinite(arr.max())):  # NaN propagates; two reductions, no mask
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(
            f"{what} contains NaN or inf (first at chunk {bad[0]}, step {bad[1]}, dim {bad[2]}); "
            "clean or drop those chunks before tokenizing"
        )
    if action_dim is not None and arr.shape[2] != action_dim:
        raise ValueError(
            f"{what} have action_dim {arr.shape[2]} but this tokenizer was fitted for action_dim {action_dim}; "
            "fit a tokenizer on data with this many action dimensions"
        )
    if time_horizon is not None and arr.shape[1] != time_horizon:
        raise ValueError(
            f"{what} have time_horizon {arr.shape[1]} but this tokenizer was fitted for time_horizon "
            f"{time_horizon}; cut chunks of {time_horizon} steps or fit a new tokenizer"
        )
    return arr


def as_id_rows(ids: Any) -> list[np.ndarray]:
    """Validate ids (a list of lists of ints, or a 2-D int array) and return one int64 array per chunk."""
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype != object:
        raise ValueError("ids must be a batch (a list of id lists); wrap a single sequence as [ids]")
    if len(ids) == 0:
        raise ValueError("ids is an empty batch; pass at least one id sequence")
    rows = []
    for i, row in enumerate(ids):
        if np.isscalar(row):
            raise ValueError("ids must be a batch (a list of id lists); wrap a single sequence as [ids]")
        arr = np.asarray(row)
        if arr.size == 0:
            rows.append(np.zeros(0, dtype=np.int64))
            continue
        if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or _all_integral(arr)):
            raise ValueError(f"ids[{i}] must be a flat sequence of integers, got {arr.dtype} of shape {arr.shape}")
        if arr.dtype.kind == "f":  # clipped before the cast, so 1e30 stays out of the vocabulary (never wraps)
            arr = np.clip(arr, INT64_FLOAT_RANGE[0], INT64_FLOAT_RANGE[1])
        rows.append(arr.astype(np.int64))
    return rows


INT64_FLOAT_RANGE = (-(2.0**63), 2.0**63 - 1024)  # the floats that cast to int64 exactly (2**63 - 1024: the last below)


def _all_integral(arr: np.ndarray) -> bool:
    return np.issubdtype(arr.dtype, np.floating) and bool(np.isfinite(arr).all()) and bool(np.all(np.mod(arr, 1) == 0))


def check_mode(mode: str) -> None:
    if mode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {mode!r}; choose one of {', '.join(DECODE_MODES)}")


def finish_decode(actions: np.ndarray, valid: np.ndarray, errors: list[str | None], mode: str) -> DecodeResult:
    """Apply the mode's policy to invalid rows: raise (strict), NaN them (mark) or keep the repair (repair)."""
    if mode == "strict" and not valid.all():
        first = int(np.flatnonzero(~valid)[0])
        raise DecodeError(first, errors[first] or "invalid ids")
    if mode == "mark" and not valid.all():
        actions[~valid] = np.nan
    return DecodeResult(actions=actions, valid=valid, errors=errors)


def as_id_batch(ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Ids as one flat int64 array plus the number of ids per chunk: ``(flat [sum(counts)], counts [B])``.

    The fast path for whole batches; falls back to ``as_id_rows`` (and its error messages) on anything unusual.
    """
    if isinstance(ids, np.ndarray) and ids.ndim == 2 and np.issubdtype(ids.dtype, np.integer) and len(ids):
        return ids.astype(np.int64).ravel(), np.full(len(ids), ids.shape[1], dtype=np.int64)
    if isinstance(ids, list) and ids and set(map(type, ids)) == {list}:
        try:  # array("q") takes ints only (a float, or an int beyond int64, raises): nothing is cast silently
            flat = array.array("q", functools.reduce(list.__iadd__, ids, []))  # one flat list, linear time
        except (TypeError, OverflowError):
            pass
        else:  # a third faster than np.array on the list, which must first find the common type
            return np.frombuffer(flat, dtype=np.int64), np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    rows = as_id_rows(ids)
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    return (np.concatenate(rows) if counts.sum() else np.zeros(0, np.int64)), counts


# --- saved configs -----------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and bool(np.isfinite(v))


# kind -> (check, what it must be); "?" suffix (in the spec) allows null
CHECKS: dict[str, tuple[Any, str]] = {
    "number>0": (lambda v: _is_number(v) and v > 0, "a positive number"),
    "number>=0": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "number[0,0.5)": (lambda v: _is_number(v) and 0 <= v < 0.5, "a number in [0, 0.5)"),
    "int": (_is_int, "an integer"),
    "int>=0": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "int>=1": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "int>=2": (lambda v: _is_int(v) and v >= 2, "an integer >= 2"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "ints>=2": (
        lambda v: isinstance(v, list) and len(v) > 0 and all(_is_int(x) and x >= 2 for x in v),
        "a non-empty list of integers >= 2",
    ),
}


def check_size(label: str, value: Any, low: int, high: int, bound: str) -> int:
    """``value`` as an int in ``[low, high]``, else a one-line ``ValueError`` naming the bound (``bound``: its
    constant's name) and the fix. For every size a tokenizer allocates by: checked when fitting and when loading."""
    if not _is_int(value) or value < low:
        raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    if value > high:
        raise ValueError(f"{label} {value} is above the bound {high} ({bound}); use at most {high}")
    return int(value)


# The bounds every saved tokenizer's shape fields obey (field -> (bound, its constant's name)).
SHAPE_BOUNDS: dict[str, tuple[float, str]] = {
    "time_horizon": (MAX_TIME_HORIZON, "MAX_TIME_HORIZON"),
    "action_dim": (MAX_ACTION_DIM, "MAX_ACTION_DIM"),
}


def check_saved(
    config: dict[str, Any], path: Path, spec: dict[str, str], bounds: dict[str, tuple[float, str]] | None = None
) -> dict[str, Any]:
    """Validate a loaded config against ``spec``: field -> a kind in ``CHECKS`` or ``"in:a,b"`` (one of those
    strings); a trailing ``"?"`` means the field may be null or absent. ``bounds``: field -> (upper bound, the name
    of its constant) for the sizes the tokenizer allocates by (on top of ``SHAPE_BOUNDS``); a list is bounded per item.

    Raises a one-line ``ValueError`` naming the file, the field, its value and the fix.
    """
    bounds = {**SHAPE_BOUNDS, **(bounds or {})}
    for key, kind in spec.items():
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if kind.startswith("in:"):
            choices = kind[3:].split(",")
            check, what = (lambda v, c=choices: v in c), "one of " + ", ".join(map(repr, choices))
        else:
            check, what = CHECKS[kind]
        if key not in config:
            if optional:
                continue
            raise ValueError(f"{path} lacks the field {key!r}; save the tokenizer again (tok.save_pretrained)")
        value = config[key]
        if value is None and optional:
            continue
        if not check(value):
            raise ValueError(
                f"{path}: field {key!r} is {value!r} but must be {what}; correct it or save the tokenizer again"
            )
        if key in bounds:
            high, name = bounds[key]
            largest = max(map(abs, value)) if isinstance(value, list) else abs(value)
            if largest > high:
                raise ValueError(
                    f"{path}: field {key!r} is {value!r}, beyond its bound {high:g} ({name}); a tokenizer never "
                    "saves that: correct it or save the tokenizer again"
                )
    return config
