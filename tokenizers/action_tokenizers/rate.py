"""FAST's rate chosen from the fitting chunks (``FASTTokenizer.fit(..., vocab_size="auto")``): the coefficient
alphabet, then the BPE vocabulary.

The vocabulary decides how many ids spell a chunk, and with it how often the model sees each id: a vocabulary large
for the data merges a whole chunk into two or three ids, each seen a handful of times, and the policy has to learn
them like classes of their own. Measured in closed loop (push-v3 from a 64 px camera, 200 demonstrations, 11k
fitting chunks, 3-4 training seeds): 1,024 ids spell a chunk in 2.5-2.8 ids and reach 36%; 128 ids spell it in 8-12
and reach 74% (4,000 steps) and 84.5% (8,000). So the rule: the largest vocabulary among ``VOCAB_CANDIDATES`` whose
typical id (the median over the ids the fitting chunks use) occurs at least ``MIN_MEDIAN_ID_COUNT`` times in them,
else the smallest. There the typical id of 1,024 occurs 30 times, of 128 about 800; on the five-task state demo (14k
chunks) 128, 256 and 1,024 ids (typical id 758, 242, 37 times) all reach 91-93% over 3 seeds (results/demo_vocab):
the threshold, 500, is set between what held on the harder data and the next size up (256 ids there: 302 times, not
yet measured in closed loop). The rule grows the vocabulary with the data; ``results/vocab_stats/`` lists what it gives
on the studied datasets.

The alphabet: a few outlying chunks can widen the range of rounded coefficients tenfold (a real 26-D humanoid dataset:
-427..639), and every id of the vocabulary must then be spent on one symbol each. ``auto_alphabet`` keeps the central
range holding all but ``ALPHABET_TAIL`` of the coefficients; the rest are clipped to it when encoded, and counted
(``encode_stats.clipped``), as any value outside a fitted alphabet is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

AUTO = "auto"
VOCAB_CANDIDATES = (128, 256, 512, 1024, 2048, 4096)
MIN_MEDIAN_ID_COUNT = 500  # the typical id is seen this often in the fitting chunks (see the module docstring)
ALPHABET_TAIL = 1e-4  # the share of rounded coefficients the auto alphabet may leave outside (clipped, counted)


@dataclass(frozen=True)
class Alphabet:
    min_token: int
    max_token: int
    clipped: float  # the share of the fitting coefficients outside, clipped when encoded
    why: str

    @property
    def n_symbols(self) -> int:
        return self.max_token - self.min_token + 1


def auto_alphabet(q: np.ndarray) -> Alphabet:
    """The range of rounded coefficients ``q`` to spell: all of it, unless its far tails (``ALPHABET_TAIL`` of the
    values at most) widen it, in which case the central range."""
    lo, hi = int(q.min()), int(q.max())
    tail_lo, tail_hi = (int(v) for v in np.quantile(q, [ALPHABET_TAIL / 2, 1 - ALPHABET_TAIL / 2], method="nearest"))
    if (tail_hi - tail_lo + 1) * 2 > hi - lo + 1:  # the tails hardly widen it: keep everything
        return Alphabet(lo, hi, 0.0, "the coefficients' full range")
    clipped = float(np.mean((q < tail_lo) | (q > tail_hi)))
    why = (
        f"the range of all but {clipped:.4%} of the coefficients (all of them span {lo}..{hi}: a few outlying "
        "chunks); those are clipped when encoded, and counted"
    )
    return Alphabet(tail_lo, tail_hi, clipped, why)


def id_counts(ids: list[list[int]], vocab_size: int) -> np.ndarray:
    """How often each id occurs in ``ids``."""
    flat = np.fromiter((i for row in ids for i in row), dtype=np.int64)
    return np.bincount(flat, minlength=vocab_size)


def choose_vocab_size(n_symbols: int, n_chunks: int, spell: Callable[[int], np.ndarray]) -> tuple[int, str]:
    """The vocabulary by the rule above. ``spell(v)`` fits a vocabulary of ``v`` ids and returns how often each id
    occurs in the fitting chunks; candidates are tried smallest first and the search stops at the first too rare."""
    candidates = [v for v in VOCAB_CANDIDATES if v > n_symbols] or [int(2 ** np.ceil(np.log2(n_symbols + 1)))]
    chosen, seen = None, []
    for v in candidates:
        counts = spell(v)
        used = counts[counts > 0]
        median = float(np.median(used)) if len(used) else 0.0
        ids_per_chunk = counts.sum() / max(n_chunks, 1)
        seen.append((v, median, ids_per_chunk))
        if median < MIN_MEDIAN_ID_COUNT:
            break
        chosen = v
    if chosen is None:
        v, median, per_chunk = seen[0]
        return v, (
            f"the smallest vocabulary that holds the {n_symbols}-symbol alphabet: even its typical id occurs only "
            f"{median:.0f} times in the {n_chunks} fitting chunks (the rule asks {MIN_MEDIAN_ID_COUNT}); "
            f"{per_chunk:.1f} ids a chunk"
        )
    v, median, per_chunk = next(s for s in seen if s[0] == chosen)
    larger = next((s for s in seen if s[0] > chosen), None)
    beyond = f"; {larger[0]} ids: {larger[1]:.0f} times" if larger else ""
    return chosen, (
        f"the largest vocabulary whose typical id occurs at least {MIN_MEDIAN_ID_COUNT} times in the "
        f"{n_chunks} fitting chunks ({median:.0f} times{beyond}); {per_chunk:.1f} ids a chunk"
    )
