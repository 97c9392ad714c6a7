"""How predicted chunks become executed actions: a queue (run the first ``n`` actions of each chunk, then ask
again) or temporal ensembling (ask every ``n`` steps and run, at each step, a weighted mean of every chunk that
covers it).

Temporal ensembling is ACT's recipe (Zhao et al., 2023, "Learning Fine-Grained Bimanual Manipulation with
Low-Cost Hardware"): the weight of the i-th oldest prediction for the current step is ``exp(-coeff * i)``, so a
positive ``coeff`` trusts older predictions more and ``coeff = 0`` averages them evenly. It smooths the switch
from one chunk to the next, which an open-loop chunk policy otherwise makes as a jump.

Both executors work on one chunk ``[T, D]`` (the rollout loop, one per episode) or a batch ``[B, T, D]``
(``VLAPolicy.select_action``), numpy or torch: actions are read as ``chunk[..., t, :]``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any


class ChunkQueue:
    """Runs the first ``n_action_steps`` actions of each chunk (all of them when None), then wants a new one."""

    def __init__(self, n_action_steps: int | None = None) -> None:
        if n_action_steps is not None and n_action_steps < 1:
            raise ValueError(f"n_action_steps must be at least 1 (or None for whole chunks), got {n_action_steps}")
        self.n_action_steps = n_action_steps
        self.reset()

    def reset(self) -> None:
        self._chunk: Any = None
        self._next = 0
        self._stop = 0

    def needs_chunk(self) -> bool:
        return self._next >= self._stop

    def add(self, chunk: Any) -> None:
        """A chunk ``[..., T, D]`` predicted at the current step."""
        self._chunk, self._next = chunk, 0
        self._stop = min(chunk.shape[-2], self.n_action_steps or chunk.shape[-2])

    def pop(self) -> Any:
        """The current step's action ``[..., D]``; then one step on."""
        if self.needs_chunk():
            raise RuntimeError("no action left: add a chunk first (needs_chunk() says when)")
        action = self._chunk[..., self._next, :]
        self._next += 1
        return action


class TemporalEnsemble:
    """Asks for a chunk every ``every`` steps; each step runs the weighted mean of the actions that every chunk
    still covering it predicted for it (oldest first, weights ``exp(-coeff * i)``)."""

    def __init__(self, coeff: float, every: int = 1) -> None:
        if not math.isfinite(coeff) or coeff < 0:
            raise ValueError(f"the temporal-ensemble coefficient must be a finite number >= 0 (ACT uses 0.01), got {coeff}")
        if every < 1:
            raise ValueError(f"a temporal ensemble asks for a chunk every n >= 1 steps, got {every}")
        self.coeff, self.every = float(coeff), int(every)
        self.reset()

    def reset(self) -> None:
        self._chunks: list[list[Any]] = []  # [chunk, index of the current step in it], oldest first
        self._since = None  # steps since the last chunk; None before the first

    def needs_chunk(self) -> bool:
        return self._since is None or self._since >= self.every or not self._chunks

    def add(self, chunk: Any) -> None:
        self._chunks.append([chunk, 0])
        self._since = 0

    def pop(self) -> Any:
        if not self._chunks:
            raise RuntimeError("no action left: add a chunk first (needs_chunk() says when)")
        total, norm = None, 0.0
        for i, (chunk, t) in enumerate(self._chunks):
            w = math.exp(-self.coeff * i)
            term = chunk[..., t, :] * w
            total = term if total is None else total + term
            norm += w
        for entry in self._chunks:
            entry[1] += 1
        self._chunks = [entry for entry in self._chunks if entry[1] < entry[0].shape[-2]]
        self._since += 1
        return total / norm


class StateHistory:
    """The last ``n`` states of an episode, oldest first; the first one repeated until there are n (as LeRobot pads
    ``n_obs_steps``). One per episode: the rollout loop keeps one per env, ``VLAPolicy.select_action`` one per batch."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a state history holds n >= 1 frames, got {n}")
        self.frames: deque = deque(maxlen=n)

    def push(self, state: Any) -> list[Any]:
        """Add this step's state; the n frames to show the policy, oldest first (stack them on the frame axis)."""
        if not self.frames:
            self.frames.extend([state] * (self.frames.maxlen - 1))
        self.frames.append(state)
        return list(self.frames)


def executor(n_action_steps: int | None, ensemble: float | None) -> ChunkQueue | TemporalEnsemble:
    """The queue for ``ensemble=None``; else a temporal ensemble asking every ``n_action_steps`` (default 1)."""
    if ensemble is None:
        return ChunkQueue(n_action_steps)
    return TemporalEnsemble(ensemble, every=n_action_steps or 1)


__all__ = ["ChunkQueue", "StateHistory", "TemporalEnsemble", "executor"]
