"""Committed actions for a policy whose tokenizer's ids mix the chunk's steps (FAST, BEAST, FSQ): no id of a chunk is
fixed by its first actions, so they cannot be forced as binning's are. The policy decodes several chunks instead
(``VLAConfig.commit_search``: the greedy one and samples at ``SEARCH_TEMPERATURE``), every one a valid spelling under
the tokenizer's constraint, and keeps per observation the one whose first actions are nearest the committed ones: a
search under the constraint. The samples are seeded (the caller's generator, else seed 0), so the same batch gives the
same chunks; an observation decoded in another batch draws other samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

SEARCH_TEMPERATURE = 1.0  # the model's own distribution: the candidates the search draws from
REFUSES_COMMITTED = (
    "this policy refuses committed actions: its {name} ids mix the chunk's steps, so they cannot be forced, and its "
    "commit_search is 0 (no search); set --policy.commit_search=8 (or more), or send no committed actions"
)


def checked_committed(committed: Sequence[object], action_dim: int, time_horizon: int) -> list[np.ndarray]:
    """Each row's committed actions as float ``[d, D]`` (``d`` may be 0), refused unless finite and ``d`` <= T."""
    rows = []
    for r, actions in enumerate(committed):
        arr = np.asarray(actions, dtype=np.float64)
        if arr.size % action_dim or (arr.ndim == 2 and arr.shape[1] != action_dim) or arr.ndim > 2:
            raise ValueError(f"committed actions of row {r} have shape {arr.shape}; send float [d, {action_dim}]")
        arr = arr.reshape(-1, action_dim)
        if len(arr) > time_horizon:
            raise ValueError(f"{len(arr)} committed actions in row {r}, more than a chunk's {time_horizon}")
        if not np.isfinite(arr).all():
            raise ValueError(f"committed actions of row {r} are not all finite")
        rows.append(arr)
    return rows


def nearest_to_committed(
    chunks: Sequence[np.ndarray], valid: Sequence[np.ndarray], committed: Sequence[np.ndarray], scale: np.ndarray
) -> np.ndarray:
    """int ``[B]``: per row, the candidate (index into ``chunks``, each raw ``[B, T, D]``) whose first ``d`` actions
    are nearest row's ``committed`` ``[d, D]`` (raw), in the mean squared error over those steps with each dim divided
    by ``scale`` (the action normaliser's, so no dim's units outweigh another's). Invalid candidates are passed over;
    a row with nothing committed, or no valid candidate, keeps the first (the greedy chunk)."""
    rows = len(chunks[0])
    pick = np.zeros(rows, dtype=np.int64)
    for r in range(rows):
        target = np.asarray(committed[r], dtype=np.float64)[: chunks[0].shape[1]]  # a chunk's worth at most
        d = len(target)
        if not d:
            continue
        errors = [
            float(np.mean(((c[r, :d] - target) / scale) ** 2)) if ok[r] else np.inf for c, ok in zip(chunks, valid)
        ]
        if np.isfinite(min(errors)):
            pick[r] = int(np.argmin(errors))
    return pick


def tiled(batch: dict[str, object], times: int) -> dict[str, object]:
    """``batch`` with its ``B`` rows repeated ``times`` over (row ``r`` of copy ``j`` at ``j * B + r``): tensors, arrays
    and lists along their first axis, anything else (a flag) as it is."""
    out: dict[str, object] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.repeat(times, *([1] * (value.dim() - 1)))
        elif isinstance(value, np.ndarray):
            out[key] = np.concatenate([value] * times)
        elif isinstance(value, (list, tuple)):
            out[key] = list(value) * times
        else:
            out[key] = value
    return out
