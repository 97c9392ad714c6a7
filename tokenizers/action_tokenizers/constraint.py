"""Constraints for decoding: which ids may come next so that the finished sequence decodes to ``[T, D]``.

A constraint is a small deterministic automaton over ids. The decoder calls ``start()`` once per sequence,
then, at every step, masks its logits with ``allowed(state)`` (a bool vector over ``[0, vocab_size)``), picks an
id and calls ``advance(state, id)``; it may stop (emit its end-of-actions token) only once ``done(state)``.

Every constraint here guarantees two things, both property-tested:
  * any sequence built by following ``allowed`` until ``done`` decodes validly to exactly ``[T, D]``;
  * from every reachable state ``done`` is reachable (there is no dead end), within ``max_length`` ids in all.
States are plain ints, so a batch of them is an int array and masks can be cached per state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Constraint(ABC):
    vocab_size: int
    max_length: int  # no accepted sequence is longer than this

    @abstractmethod
    def start(self) -> int: ...

    @abstractmethod
    def allowed(self, state: int) -> np.ndarray:
        """Bool mask ``[vocab_size]`` of the ids that may come next (all False once ``done``)."""

    @abstractmethod
    def _next(self, state: int, token_id: int) -> int: ...

    @abstractmethod
    def done(self, state: int) -> bool: ...

    def advance(self, state: int, token_id: int) -> int:
        token_id = int(token_id)
        if not (0 <= token_id < self.vocab_size) or not self.allowed(state)[token_id]:
            raise ValueError(f"id {token_id} is not allowed in state {state}; pick one where allowed(state) is True")
        return self._next(state, token_id)

    def accepts(self, ids: list[int]) -> bool:
        """Whether ``ids`` is a complete sequence this constraint can produce."""
        state = self.start()
        for token_id in ids:
            if not (0 <= int(token_id) < self.vocab_size) or not self.allowed(state)[int(token_id)]:
                return False
            state = self._next(state, int(token_id))
        return self.done(state)


class LengthConstraint(Constraint):
    """Each id stands for a fixed number of values (``lengths[id]`` >= 1); exactly ``total`` values are needed.

    The state is the number of values still to emit; an id is allowed when it fits. Fixed-length tokenizers
    (binning, FSQ) are the case ``lengths == 1``. No dead ends as long as some id has length 1.
    """

    def __init__(self, lengths: np.ndarray, total: int):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.vocab_size = len(self.lengths)
        self.total = int(total)
        self.max_length = self.total
        assert (self.lengths >= 1).all() and (self.lengths == 1).any(), "need ids of length >= 1, some of length 1"
        self._masks: dict[int, np.ndarray] = {}

    def start(self) -> int:
        return self.total

    def allowed(self, state: int) -> np.ndarray:
        mask = self._masks.get(state)
        if mask is None:
            mask = self._masks[state] = self.lengths <= state
            mask.flags.writeable = False
        return mask

    def _next(self, state: int, token_id: int) -> int:
        return state - int(self.lengths[token_id])

    def done(self, state: int) -> bool:
        return state == 0


def fixed_length(vocab_size: int, length: int) -> LengthConstraint:
    """Any id, exactly ``length`` of them."""
    return LengthConstraint(np.ones(vocab_size, dtype=np.int64), length)
