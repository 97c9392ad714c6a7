"""Smooth synthetic action chunks, for tests, benchmarks and examples (no dataset needed)."""

from __future__ import annotations

import numpy as np


def smooth_chunks(
    n: int, time_horizon: int = 10, action_dim: int = 7, seed: int = 0, noise: float = 0.02
) -> np.ndarray:
    """``[n, T, D]`` sums of two low-frequency sinusoids per dimension plus a little noise, mostly in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, time_horizon)[None, :, None]
    out = np.zeros((n, time_horizon, action_dim))
    for _ in range(2):
        freq = rng.uniform(0.1, 1.2, (n, 1, action_dim))
        phase = rng.uniform(0, 2 * np.pi, (n, 1, action_dim))
        amp = rng.uniform(0.1, 0.45, (n, 1, action_dim))
        out += amp * np.sin(2 * np.pi * freq * t + phase)
    return out + noise * rng.standard_normal(out.shape)
