"""A BPE model's merges applied to a whole batch of words at once, giving exactly the ids of Hugging Face's BPE model.

The model merges, within each word, the adjacent pair of lowest rank (the leftmost first on a tie: a run ``x x x`` of
the pair ``(x, x)`` merges from the left) until no adjacent pair is a merge. Here every word advances together, one
*stage* at a time: a run of consecutive ranks none of which uses an id another merge of the run makes. When no merge
ranks below a merge that makes one of its parts (``orderly``: true of every trained vocabulary, where a token exists
from its own merge on), a stage's merges make only pairs of later stages, so all of a stage's pairs are there when it
starts and none comes during it; the model's order then only matters where two of them overlap (share an id), and there
the pair of lower (rank, position) wins (``_first_of_overlaps``, in closed form along each chain of overlaps).

    merges = Merges.from_bpe(bpe)               # None: not a vocabulary this module reproduces (the model is used)
    tokens = merges.apply(words)                # the words' ids, a gap after each -> their tokens, likewise

A trained vocabulary of a thousand merges falls into a handful of stages (7 for FAST's published byte-level
vocabulary on smooth [10, 7] chunks), so a batch costs a few passes of array operations per stage instead of the model's
per-word merging and the Python objects it returns for each token.
"""

from __future__ import annotations

import json

import numpy as np

from tokenizers import Tokenizer

MAX_VOCAB = 2048  # the pair -> rank table holds (vocab_size + 1)^2 int16s (8 MiB at 2048); larger: the BPE model
# Model options under which the BPE model is plain merging (no dropout, no unknown token, no affixes, no fallbacks).
PLAIN = {
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "byte_fallback": False,
    "ignore_merges": False,
}


class Merges:
    """``rank[left * stride + right]``: the rank of the merge of ids ``(left, right)`` (``none`` if there is none;
    ``stride = vocab_size + 1``, the extra id ``gap`` pairing with nothing); ``left``, ``right``, ``new`` ``[M]``: each
    rank's pair and the id it makes; ``stage_ranks``: each stage's ranks as ``(first, end)``."""

    def __init__(self, vocab_size: int, left: np.ndarray, right: np.ndarray, new: np.ndarray):
        self.vocab_size, self.left, self.right, self.new = vocab_size, left, right, new
        self.none = len(left)  # the rank of a pair that is no merge: after every real one
        self.gap = vocab_size  # an id past the vocabulary, between words: it pairs with nothing
        self.stride = vocab_size + 1
        self.rank = np.full(self.stride * self.stride, self.none, dtype=np.int16)
        self.rank[left * self.stride + right] = np.arange(len(left))
        firsts, made = [0], set()
        for r, (a, b, c) in enumerate(zip(left.tolist(), right.tolist(), new.tolist())):
            if a in made or b in made:  # uses an id the stage makes: the next stage begins here
                firsts.append(r)
                made = set()
            made.add(c)
        self.stage_ranks = list(zip(firsts, [*firsts[1:], self.none])) if self.none else []

    @classmethod
    def from_bpe(cls, bpe: Tokenizer) -> Merges | None:
        """The merges of ``bpe``'s model, or None when ``apply`` would not give its ids (options, size, order)."""
        model = json.loads(bpe.to_str())["model"]
        vocab, merges = model.get("vocab") or {}, model.get("merges") or []
        if model.get("type") != "BPE" or any(model.get(k, v) != v for k, v in PLAIN.items()):
            return None
        if not 0 < len(vocab) <= MAX_VOCAB or set(vocab.values()) != set(range(len(vocab))) or len(merges) >= 2**15:
            return None
        pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]  # older files write "a b"
        if any(len(p) != 2 or p[0] not in vocab or p[1] not in vocab or p[0] + p[1] not in vocab for p in pairs):
            return None
        left = np.array([vocab[a] for a, _ in pairs], dtype=np.int64)
        right = np.array([vocab[b] for _, b in pairs], dtype=np.int64)
        new = np.array([vocab[a + b] for a, b in pairs], dtype=np.int64)
        merges_of = cls(len(vocab), left, right, new)
        return merges_of if merges_of.orderly() else None

    def orderly(self) -> bool:
        """Each pair merges at one rank, and every merge using an id ranks above every merge making it."""
        ranks = np.arange(self.none)
        made_at = np.full(self.vocab_size, -1)
        np.maximum.at(made_at, self.new, ranks)
        unique = len(np.unique(self.left * self.vocab_size + self.right)) == self.none
        return unique and bool((made_at[self.left] < ranks).all() and (made_at[self.right] < ranks).all())

    def apply(self, words: np.ndarray) -> np.ndarray:
        """``words [S]``: the symbols' ids, each word followed by ``self.gap`` (an id that pairs with nothing) -> the
        merged tokens in order, still each word followed by a gap."""
        ids = words.astype(np.int32)  # int32: half the memory traffic of int64, and every key below fits
        for lo, hi in self.stage_ranks:
            pair = self.rank[ids[:-1] * self.stride + ids[1:]]  # [S - 1] the rank of each adjacent pair
            in_stage = (pair - lo).view(np.uint16) < hi - lo  # lo <= rank < hi (below lo wraps around to the top)
            pos = np.flatnonzero(in_stage)  # [C] the stage's pairs, in order
            if not len(pos):
                continue
            rank = pair[pos]
            overlap = pos[1:] == pos[:-1] + 1  # [C - 1] pairs k and k + 1 share an id
            if overlap.any():
                first = _first_of_overlaps(rank, overlap)
                pos, rank = pos[first], rank[first]
            ids[pos] = self.new[rank]
            kept = np.ones(len(ids), dtype=bool)
            kept[pos + 1] = False  # the right id of each pair is now part of the left one
            ids = ids[kept]
        return ids


def _first_of_overlaps(rank: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    """Pairs in order, ``rank [C]``, ``overlap [C - 1]``: pairs k and k + 1 share an id -> ``[C]`` bool, the pairs that
    merge when the pair of lowest (rank, position) goes first and takes its ids from the pairs it overlaps.

    Along a chain of overlapping pairs the outcome alternates away from each pair that comes before both neighbours:
    a pair merges when the runs of ever earlier pairs beside it (to its left, and to its right) are both even.
    """
    c = len(rank)
    k = np.arange(c, dtype=np.int32)
    first_left = overlap & (rank[:-1] <= rank[1:])  # [C - 1] pair k comes before pair k + 1 (on a tie: the left)
    rising = np.concatenate([[False], first_left])  # the pair on the left overlaps and comes first
    to_left = k - np.maximum.accumulate(np.where(rising, 0, k))  # earlier pairs in a row to the left
    falling = np.concatenate([overlap & ~first_left, [False]])  # the pair on the right overlaps and comes first
    if not falling.any():  # e.g. a stage of one rank: its chains are runs x x x ... of one pair
        return (to_left & 1) == 0
    to_right = np.minimum.accumulate(np.where(falling, c, k)[::-1])[::-1] - k
    return ((to_left | to_right) & 1) == 0
