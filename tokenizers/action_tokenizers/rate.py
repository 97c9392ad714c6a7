"""FAST's rate chosen from the fitting chunks (``FASTTokenizer.fit(..., vocab_size="auto")``): the coefficient
alphabet, then the BPE vocabulary.

The vocabulary decides how many ids spell a chunk, and with it how often the model sees each id: a vocabulary large
for the data merges a whole chunk into two or three ids, each seen a handful of times, and the policy has to learn
them like classes of their own. Measured in closed loop (push-v3 from a 64 px camera, 200 demonstrations, 11k
fitting chunks, 3-4 training seeds): 1,024 ids spell a chunk in 2.5-2.8 ids and reach 36%; 128 ids spell it in 8-12
and reach 74% (4,000 steps) and 84.5% (8,000). So the rule: the largest vocabulary among ``VOCAB_CANDIDATES`` whose
typical id (the median over the ids the fitting chunks use) occurs at least ``MIN_MEDIAN_ID_COUNT_PER_STEP`` times
the chunk length T in them, else the smallest. The count scales with T because training takes one chunk per frame: a
frame is in T chunks, and a longer chunk counts the same stretch of demonstration more often. At T = 10 the rule asks
500: there (push-v3 from pixels, 11k chunks) the typical id of 1,024 occurs 30 times, of 128 about 800; on the
five-task state demo (14k chunks) 128, 256 and 1,024 ids (typical id 758, 242, 37 times) all reach 91-93% over 3
seeds (results/demo_vocab). On ALOHA transfer-cube (T = 50, 52k chunks of 50 x 14) it asks 2,500: 256 ids (typical id
5,703 times) rather than 512 (1,922) or the 1,024 (604) that a count not scaled by T chose, which reached 72.7%
against 256 ids' 79.0% over 3 seeds, higher on each seed (p = 0.17 over seeds: a lead, not yet a verdict;
results/aloha_cube, results/aloha_vocab). The rule grows the vocabulary with the
data; ``results/vocab_stats/`` lists what it gives on the studied datasets.

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
MIN_MEDIAN_ID_COUNT_PER_STEP = 50  # the typical id is seen this often times T in the fitting chunks (module docstring)
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


def min_median_id_count(time_horizon: int) -> int:
    """How often the typical id must occur in chunks of ``time_horizon`` steps, one per frame (the rule above)."""
    return MIN_MEDIAN_ID_COUNT_PER_STEP * time_horizon


def choose_vocab_size(
    n_symbols: int, n_chunks: int, time_horizon: int, spell: Callable[[int], np.ndarray]
) -> tuple[int, str]:
    """The vocabulary by the rule above. ``spell(v)`` fits a vocabulary of ``v`` ids and returns how often each id
    occurs in the fitting chunks, one count per id of the vocabulary built (fewer than ``v`` when the BPE runs out
    of pairs to merge, and then every larger candidate builds the same one); candidates are tried smallest first and
    the search stops at the first too rare, or at the first the BPE could not fill. Returns the candidate chosen
    (``spell``'s argument) and why, in the sizes actually built."""
    candidates = [v for v in VOCAB_CANDIDATES if v > n_symbols] or [int(2 ** np.ceil(np.log2(n_symbols + 1)))]
    least = min_median_id_count(time_horizon)
    chosen, seen = None, {}
    for v in candidates:
        counts = spell(v)
        used = counts[counts > 0]
        median = float(np.median(used)) if len(used) else 0.0
        seen[v] = (len(counts), median, counts.sum() / max(n_chunks, 1))  # built size, median count, ids a chunk
        if median < least:
            break
        chosen = v
        if len(counts) < v:  # the merges ran out: a larger candidate would build this vocabulary again
            break
    rule = f"{least} times ({MIN_MEDIAN_ID_COUNT_PER_STEP} per step of the {time_horizon}-step chunks)"
    if chosen is None:
        v = candidates[0]
        size, median, per_chunk = seen[v]
        return v, (
            f"the smallest vocabulary that holds the {n_symbols}-symbol alphabet ({size} ids): even its typical id "
            f"occurs only {median:.0f} times in the {n_chunks} fitting chunks (the rule asks {rule}); "
            f"{per_chunk:.1f} ids a chunk"
        )
    size, median, per_chunk = seen[chosen]
    if size < chosen:
        return chosen, (
            f"every pair seen twice merged: {size} ids, fewer than the rule allows (its typical id occurs {median:.0f} "
            f"times in the {n_chunks} fitting chunks, the rule asks {rule}); {per_chunk:.1f} ids a chunk"
        )
    larger = next((k for k in seen if k > chosen), None)
    beyond = f"; {seen[larger][0]} ids: {seen[larger][1]:.0f} times" if larger else ""
    return chosen, (
        f"the largest vocabulary whose typical id occurs at least {rule} in the {n_chunks} fitting chunks "
        f"({median:.0f} times{beyond}); {per_chunk:.1f} ids a chunk"
    )
