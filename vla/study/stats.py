"""The statistics of a closed-loop verdict: a success rate is a mean over training seeds with its spread, and an
interval over episodes.

    wilson(successes=43, n=50)            # (0.73, 0.93): the 95% Wilson score interval of one run's rate
    cell = aggregate(runs)                # mean over seeds, std, min, per-seed rates, pooled Wilson interval
    compare(cell_a, cell_b)               # Welch's t-test over the seeds' rates: is the gap more than seed noise?

Two sources of noise: the episodes of one evaluation (binomial; 50 episodes at 50% carry about +-14 points) and the
training seed (a recipe whose seeds reach 40% and 100% has a mean, not a value). The Wilson interval covers the
first only; the spread over seeds and Welch's test over the per-seed rates carry the second, which is the one that
decides whether one tokenizer beats another.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

Z95 = 1.959963984540054  # the normal quantile of 0.975
MIN_SEEDS = 3  # training seeds a cell needs for a verdict: fewer gives a number, not a spread to test against


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate (Wilson, 1927): well behaved at 0% and 100%, unlike the normal
    approximation. ``n == 0`` gives the uninformative ``(0, 1)``."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (rounding would leave 1 - 1e-16)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One grid cell (a setting x a tokenizer) over its training seeds. Each run holds ``seed`` and ``successes``
    (one bool per evaluation episode)."""
    if not runs:
        raise ValueError("a cell needs at least one finished run")
    rates = np.array([np.mean(r["successes"]) for r in runs], dtype=float)
    wins = int(sum(int(np.sum(r["successes"])) for r in runs))
    episodes = int(sum(len(r["successes"]) for r in runs))
    low, high = wilson(wins, episodes)
    return {
        "seeds": [r["seed"] for r in runs],
        "rates": rates.tolist(),
        "mean": float(rates.mean()),
        "std": float(rates.std(ddof=1)) if len(rates) > 1 else 0.0,  # the spread over training seeds
        "min": float(rates.min()),
        "max": float(rates.max()),
        "episodes": episodes,  # pooled over seeds
        "successes": wins,  # pooled over seeds
        "wilson95": [low, high],  # over the pooled episodes: the evaluation's noise only
        "run_wilson95": [list(wilson(int(np.sum(r["successes"])), len(r["successes"]))) for r in runs],
    }


def compare(a: dict[str, Any], b: dict[str, Any], alpha: float = 0.05) -> dict[str, Any]:
    """Is cell ``a``'s mean rate different from ``b``'s beyond the spread over training seeds? Welch's t-test over
    the per-seed rates (the unit that varies between runs of a recipe is the training seed, not the episode); no
    verdict with fewer than ``MIN_SEEDS`` seeds in a cell."""
    ra, rb = np.asarray(a["rates"], float), np.asarray(b["rates"], float)
    gap = float(ra.mean() - rb.mean())
    if len(ra) < MIN_SEEDS or len(rb) < MIN_SEEDS:
        return {"gap": gap, "p_value": None, "significant": False, "why": f"fewer than {MIN_SEEDS} seeds in a cell"}
    if np.ptp(np.concatenate([ra, rb])) == 0:
        return {"gap": 0.0, "p_value": 1.0, "significant": False, "why": "every seed has the same rate"}
    if ra.std() == 0 and rb.std() == 0:  # the seed noise unmeasured (t infinite): only the episodes' noise is left
        table = [[a["successes"], a["episodes"] - a["successes"]], [b["successes"], b["episodes"] - b["successes"]]]
        p = float(scipy_stats.fisher_exact(table).pvalue)
        return {
            "gap": gap,
            "p_value": p,
            "significant": bool(p < alpha),
            "why": "every seed of each cell at one rate: Fisher's exact test over the pooled episodes",
            "test": "fisher",
        }
    with warnings.catch_warnings():  # a cell whose seeds agree: scipy warns about precision, the test still holds
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(scipy_stats.ttest_ind(ra, rb, equal_var=False).pvalue)
    return {
        "gap": gap,
        "p_value": p,
        "significant": bool(p < alpha),
        "why": f"Welch's t-test over seeds, alpha {alpha}",
        "test": "welch",
    }
