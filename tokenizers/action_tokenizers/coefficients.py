"""FAST's coefficient layer: the DCT over time, quantisation, the coefficient order, ints <-> strings, and flat ids
-> rows.

    chunk [B, T, D] --dct--> coef --quantize(scale, deadzone)--> q [B, T, D] (integer-valued floats)
      --flatten(order)--> [B, T * D] --to_symbols(clip, then cast)--> ints
"""

from __future__ import annotations

import gc
import math

import numpy as np
import scipy.fft

# The scales a FAST tokenizer takes (fitted, given or loaded): below, one id would span the whole normalised range;
# above, a [-1, 1] chunk's coefficients would need more symbols than an alphabet holds.
SCALE_RANGE = (1e-3, 1e4)


def dct(chunks: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II over the time axis of ``[B, T, D]``.

    Computed over the last axis of the ``[B, D, T]`` view (the same numbers, half the time: each transform reads
    contiguous memory) and returned as a ``[B, T, D]`` view of that, so a dimension-major flatten is free.
    """
    return scipy.fft.dct(chunks.transpose(0, 2, 1), axis=-1, norm="ortho").transpose(0, 2, 1)


def idct(coef: np.ndarray) -> np.ndarray:
    return scipy.fft.idct(coef.transpose(0, 2, 1), axis=-1, norm="ortho").transpose(0, 2, 1)


def quantize(coef: np.ndarray, scale: float, deadzone: float = 0.0) -> np.ndarray:
    """``round(coef * scale)`` (half to even, like the reference), with values below ``0.5 + deadzone`` set to 0.

    Returns integer-valued *floats*: casting is ``to_symbols``' job, after the clip (a cast first would wrap values
    beyond int64's range).
    """
    x = coef * scale
    keep = np.abs(x) >= 0.5 + deadzone if deadzone else None
    np.rint(x, out=x)  # = np.around(x): half to even
    if keep is not None:
        x *= keep  # a multiply, not a masked store: 4x faster (a zeroed negative is -0.0, which casts to 0)
    return x


def to_symbols(q: np.ndarray, offset: int, top: int) -> tuple[np.ndarray, int]:
    """Rounded coefficients (integer-valued floats) -> symbols ``q - offset`` as int64 clipped to ``[0, top]``, and
    how many were outside. The clip is done on the floats, before the cast, so a huge value becomes the extreme
    symbol and is counted, never wrapped."""
    low, high = offset, offset + top
    outside = 0
    if q.size and (q.min() < low or q.max() > high):
        outside = int(np.count_nonzero((q < low) | (q > high)))
        q = np.clip(q, low, high)
    symbols = q.astype(np.int64)
    symbols -= offset
    return symbols, outside


def scale_for_rmse(coef: np.ndarray, target_rmse: float, deadzone: float = 0.0) -> float:
    """The smallest scale (to 0.1%) whose quantisation RMSE on ``coef`` is at most ``target_rmse``.

    The DCT is orthonormal, so the RMSE of the coefficients is the RMSE of the chunks.
    """
    if not (np.isfinite(target_rmse) and target_rmse > 0):
        raise ValueError(f"target_rmse must be a positive number, got {target_rmse!r}")

    def rmse(scale: float) -> float:
        return float(np.sqrt(np.mean((quantize(coef, scale, deadzone) / scale - coef) ** 2)))

    lo, hi = SCALE_RANGE
    if rmse(hi) > target_rmse:
        raise ValueError(f"target_rmse {target_rmse} is below what any scale up to {hi:g} reaches; ask for more")
    for _ in range(60):  # bisection in log-scale; the RMSE falls (not strictly) as the scale grows
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if rmse(mid) <= target_rmse else (mid, hi)
        if hi / lo < 1.001:
            break
    return hi


def flatten(q: np.ndarray, order: str) -> np.ndarray:
    """``[B, T, D]`` -> ``[B, T * D]``: frequency-major (C order, the reference) or dimension-major."""
    return (q if order == "frequency" else q.transpose(0, 2, 1)).reshape(len(q), -1)


def unflatten(flat: np.ndarray, order: str, time_horizon: int, action_dim: int) -> np.ndarray:
    if order == "frequency":
        return flat.reshape(len(flat), time_horizon, action_dim)
    return flat.reshape(len(flat), action_dim, time_horizon).transpose(0, 2, 1)


def ints_to_strings(symbols: np.ndarray) -> list[str]:
    """Rows of non-negative ints ``[B, L]`` -> B strings of those code points, without a loop per value."""
    b, n = symbols.shape
    text = np.ascontiguousarray(symbols, dtype="<u4").tobytes().decode("utf-32-le")
    return [text[i * n : (i + 1) * n] for i in range(b)]


def string_to_ints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)


def split_rows(ids: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    """Flat ids and ids per row ``[B]`` -> B lists of ints (the inverse of ``base.as_id_batch``).

    The garbage collector is paused meanwhile: the B new lists would trigger several full passes, and lists of
    ints cannot form cycles. On 10k rows this halves the time.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        flat, ends = ids.tolist(), np.cumsum(counts).tolist()
        return [flat[a:z] for a, z in zip([0, *ends[:-1]], ends)]
    finally:
        if enabled:
            gc.enable()
