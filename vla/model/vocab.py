"""The model's vocabulary (``VocabMap``): text ids, then action ids. Two layouts:
* ``compact`` (default, no download): 4 special ids, 256 byte ids, 256 number ids and optionally one id per
  listed word (a built-in text tokenizer, ``ByteTextTokenizer``), then action id ``t`` at ``516 + words + t``.
* ``paligemma``: PaliGemma's own 257152-id Gemma vocabulary, read from a local ``tokenizer.json``; action id
  ``t`` reuses text id ``257152 - 1 - 128 - t`` (openpi's mapping: the top 128 ids are special tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vla.model.text import ACTION_MARKER, END_OF_ACTIONS, ByteTextTokenizer, TextTokenizer

PALIGEMMA_TEXT_VOCAB = 257152  # Gemma tokenizer ids in PaliGemma; the action map counts down from here
PALIGEMMA_SKIP = 128  # openpi leaves the top 128 ids (special tokens) alone


@dataclass(frozen=True)
class VocabMap:
    """Where text and action ids live in the model's vocabulary: the only place that knows.

    >>> vm = VocabMap.compact(action_vocab_size=256)
    >>> vm.action_to_vocab(np.array([0, 255])).tolist(), vm.model_vocab_size
    ([516, 771], 772)
    """

    text: TextTokenizer
    action_vocab_size: int
    layout: str  # "compact" or "paligemma"
    model_vocab_size: int  # rows of the model's embedding table
    action_base: int  # the model id of action 0 (compact: ids count up from it; paligemma: down)
    end_id: int = field(init=False)  # "|"
    marker_ids: tuple[int, ...] = field(init=False)  # "Action: "

    @classmethod
    def compact(cls, action_vocab_size: int, words: list[str] | tuple[str, ...] = ()) -> VocabMap:
        text = ByteTextTokenizer(words)
        return cls(text, int(action_vocab_size), "compact", text.size + int(action_vocab_size), text.size)

    @classmethod
    def paligemma(cls, text: TextTokenizer, action_vocab_size: int, model_vocab_size: int = 257216) -> VocabMap:
        """openpi's map on PaliGemma's vocabulary: action ``t`` -> ``257152 - 1 - 128 - t``."""
        base = PALIGEMMA_TEXT_VOCAB - 1 - PALIGEMMA_SKIP
        if action_vocab_size > base - 1000:  # keep the common text ids (and the ones the prompt uses) free
            raise ValueError(
                f"an action vocabulary of {action_vocab_size} ids does not fit under PaliGemma's text ids; "
                "use a tokenizer with fewer ids (FAST vocab_size <= 2048 is typical)"
            )
        return cls(text, int(action_vocab_size), "paligemma", int(model_vocab_size), base)

    def __post_init__(self) -> None:
        ids = self.text.encode(END_OF_ACTIONS)
        if len(ids) != 1:
            raise ValueError(f"the text tokenizer must encode {END_OF_ACTIONS!r} as one id, got {ids}")
        object.__setattr__(self, "end_id", ids[0])
        object.__setattr__(self, "marker_ids", tuple(self.text.encode(ACTION_MARKER)))
        lo, hi = self.action_id_range
        special = {self.end_id, self.text.eos_id, self.text.pad_id, self.text.bos_id, self.text.image_id}
        clash = sorted(i for i in special | set(self.marker_ids) if lo <= i < hi)
        if clash:
            raise ValueError(f"text ids {clash} fall in the action range [{lo}, {hi}); use a smaller action vocabulary")

    @property
    def action_id_range(self) -> tuple[int, int]:
        """``[lo, hi)`` of the model ids that stand for actions."""
        if self.layout == "compact":
            return self.action_base, self.action_base + self.action_vocab_size
        return self.action_base - self.action_vocab_size + 1, self.action_base + 1

    def action_to_vocab(self, ids: np.ndarray | torch.Tensor | list[int]):
        """Action-tokenizer ids -> model ids (same type as given; lists become numpy arrays)."""
        if isinstance(ids, list):
            ids = np.asarray(ids, dtype=np.int64)
        return self.action_base + ids if self.layout == "compact" else self.action_base - ids

    def vocab_to_action(self, ids: np.ndarray | torch.Tensor | list[int]):
        """Model ids -> action-tokenizer ids; ids outside the action range map to -1."""
        if isinstance(ids, list):
            ids = np.asarray(ids, dtype=np.int64)
        out = ids - self.action_base if self.layout == "compact" else self.action_base - ids
        inside = (out >= 0) & (out < self.action_vocab_size)
        return torch.where(inside, out, -1) if isinstance(out, torch.Tensor) else np.where(inside, out, -1)

    def is_action(self, ids):
        lo, hi = self.action_id_range
        return (ids >= lo) & (ids < hi)
