"""Exact statistics of a dataset's frames, and LeRobot's ``meta/stats.json`` (read, and rewritten exactly).

frame_stats(info, ["action", "observation.state"], episodes)   # min, max, mean, std, q01..q99 of the frames
write_exact_stats(root)                                          # `vla data stats`: into meta/stats.json
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data.reader import DatasetInfo, _check_root, _read_frames, as_info, nonfinite
from vla.io import atomic_write_text, read_json, write_json


def load_stats(root: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """``meta/stats.json`` as arrays: ``{feature: {"min", "max", "mean", "std", "q01", ..., "q99", "count"}}``.

    LeRobot computes min/max/mean/std exactly over all frames; its quantiles are the frame-weighted mean
    of per-episode histogram quantiles, which is not a quantile of the data at all (lerobot issue #4156). It
    is far too narrow wherever the data varies more between episodes than within one: on the default push-v3
    dataset the puck's x range comes out at 35% of the true q01..q99 and the goal's at 0 (constant within an
    episode, so every episode's q01 equals its q99). Normalise with ``frame_stats`` instead.
    """
    root = _check_root(root)
    path = root / "meta" / "stats.json"
    if not path.is_file():
        raise ValueError(
            f"{path} is missing; LeRobot writes it when a recording is finalised. Recompute it with "
            "lerobot's compute_stats, or normalise with stats you fit yourself."
        )
    raw = read_json(path, "dataset stats")
    return {feature: {name: np.asarray(v) for name, v in stats.items()} for feature, stats in raw.items()}


def frame_stats(
    root: str | Path | DatasetInfo, features: list[str], episodes: list[int] | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Exact statistics of vector features over the chosen episodes' frames (all when None), in
    ``load_stats``' layout: ``{feature: {"min", "max", "mean", "std", "q01", "q99", "count"}}``.

    Reads only those columns (no images): a million 39-D states are ~160 MB for the moment it takes.
    """
    info = as_info(root)
    missing = [f for f in features if f not in info.features]
    if missing:
        raise ValueError(f"{info.root} has no feature {', '.join(map(repr, missing))} (it has {sorted(info.features)})")
    chosen = info.episode_index.tolist() if episodes is None else sorted(int(e) for e in episodes)
    if not chosen:
        raise ValueError("frame_stats needs at least one episode")
    frames = _read_frames(info, chosen, list(features))
    for name, problem in nonfinite(frames, list(features)).items():
        raise ValueError(
            f"{info.root}: '{name}' holds NaN or inf: {problem}. Fix or drop those frames (or the "
            "episode) in the dataset; training cannot normalise them"
        )
    return {name: array_stats(frames[name]) for name in features}


def array_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact statistics of rows ``[N, D]`` in ``load_stats``' layout (min, max, mean, std, count, q01..q99)."""
    x = np.asarray(x, dtype=np.float64)
    stats = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([len(x)])}
    return stats | {f"q{round(q * 100):02d}": np.quantile(x, q, axis=0) for q in (0.01, 0.10, 0.50, 0.90, 0.99)}


def write_exact_stats(root: str | Path | DatasetInfo) -> Path:
    """Replace ``meta/stats.json``'s entries for the action and state with exact statistics of every frame (LeRobot's
    layout, so every LeRobot policy trained on the dataset normalises with them); the original is kept beside it as
    ``stats.json.orig`` (once), and the new file is written atomically. Returns the new file's path."""
    info = as_info(root)
    path = info.root / "meta" / "stats.json"
    old = read_json(path, "dataset stats") if path.is_file() else {}
    exact = frame_stats(info, [f for f in (ACTION, OBS_STATE) if f in info.features])
    if path.is_file() and not (info.root / "meta" / "stats.json.orig").exists():
        atomic_write_text(info.root / "meta" / "stats.json.orig", path.read_text())
    new = old | {name: {k: v.tolist() for k, v in entry.items()} for name, entry in exact.items()}
    write_json(path, new)
    return path
