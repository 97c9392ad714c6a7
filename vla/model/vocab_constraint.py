"""The tokenizer's constraint lifted to the model's vocabulary (``VocabConstraint``): while the automaton over action
ids (``action_tokenizers.Constraint``) is not done only the action ids it allows are possible, once done only
``"|"`` is; masks are cached per automaton state. ``fixed_chunk_length`` says whether every accepted chunk has the
same number of ids (what one-pass decoding needs)."""

from __future__ import annotations

import numpy as np
import torch
from action_tokenizers import Constraint
from action_tokenizers.constraint import LengthConstraint

from vla.model.vocab import VocabMap


def fixed_chunk_length(constraint: Constraint) -> int | None:
    """The number of ids every accepted chunk has, or None when chunks vary in length (FAST).

    The tokenizer library has no such property; a ``LengthConstraint`` whose ids all stand for one value (binning,
    FSQ, BEAST: ``action_tokenizers.constraint.fixed_length``) accepts exactly ``total`` ids, any of them anywhere.
    """
    if isinstance(constraint, LengthConstraint) and bool((constraint.lengths == 1).all()):
        return constraint.total
    return None


class VocabConstraint:
    """A tokenizer constraint over model ids: ``masks(states)`` is a bool ``[B, V]`` tensor.

    Each automaton state's mask is built once and kept as a row of a table, so a step costs one gather.
    """

    def __init__(self, constraint: Constraint, vocab: VocabMap):
        if constraint.vocab_size != vocab.action_vocab_size:
            raise ValueError(
                f"the constraint is over {constraint.vocab_size} action ids but the vocabulary map holds "
                f"{vocab.action_vocab_size}; build both from the same tokenizer"
            )
        self.constraint = constraint
        self.vocab = vocab
        self.max_length = constraint.max_length
        self._action_ids = torch.as_tensor(vocab.action_to_vocab(np.arange(vocab.action_vocab_size)))  # [A]
        self._row: dict[int, int] = {}  # automaton state -> row of the table
        self._rows: list[torch.Tensor] = []
        self._table = torch.zeros(0, vocab.model_vocab_size, dtype=torch.bool)  # [n_states, V]

    def start(self) -> int:
        return self.constraint.start()

    def done(self, state: int) -> bool:
        return self.constraint.done(state)

    def mask(self, state: int) -> torch.Tensor:
        """bool ``[V]``: the allowed action ids, or only ``"|"`` once the constraint is done (training's grammar:
        ``"|"`` always precedes EOS, so EOS is never needed to stop a constrained row)."""
        row = self._row.get(state)
        if row is None:
            m = torch.zeros(self.vocab.model_vocab_size, dtype=torch.bool)
            if self.constraint.done(state):
                m[self.vocab.end_id] = True
            else:
                m[self._action_ids] = torch.tensor(np.asarray(self.constraint.allowed(state), dtype=bool))
            row = self._row[state] = len(self._rows)
            self._rows.append(m)
        return self._rows[row]

    def masks(self, states: list[int]) -> torch.Tensor:
        """bool ``[B, V]`` for a batch of states."""
        for s in set(states) - self._row.keys():
            self.mask(s)
        if len(self._table) != len(self._rows):
            self._table = torch.stack(self._rows)
        if len(states) == 1:  # one observation (a robot's): a view of its row, no index tensor to build
            row = self._row[states[0]]
            return self._table[row : row + 1]
        return self._table[torch.tensor([self._row[s] for s in states])]

    def advance_batch(self, states: list[int], model_ids: torch.Tensor, active: list[int]) -> None:
        """Advance the automaton states of the rows in ``active`` by their ids, in place (stop ids leave a done state
        as it is), mapping the ids back to action ids in one vectorised call."""
        actions = self.vocab.vocab_to_action(model_ids.cpu().numpy()).tolist()
        for i in active:
            if not self.constraint.done(states[i]):
                states[i] = self.constraint.advance(states[i], actions[i])
