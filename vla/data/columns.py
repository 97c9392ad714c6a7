"""Columns read straight from a dataset's parquet files, no images, no torch: every action chunk at once
(``action_chunks``, in the order ``ActionChunkDataset`` gives its samples), the state at each chunk's start, each
frame's task and its state change. What tokenizer fitting, ``vla compare`` and the held-out report read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data.reader import DatasetInfo, _check_episodes, _check_time_horizon, _read_frames, as_info


def action_chunks(
    root: str | Path | DatasetInfo,
    time_horizon: int,
    *,
    episodes: list[int] | None = None,
    stride: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Every action chunk of the dataset (or of ``episodes``) as one array, reading only parquet columns.

    Returns ``chunks`` float32 [N, T, D] and ``is_pad`` bool [N, T]: one chunk per frame (every
    ``stride``-th frame of each episode, counted from its first), in dataset order. Chunks running past
    their episode's end repeat its last action, flagged in ``is_pad`` — the same values
    ``ActionChunkDataset`` gives sample by sample. With ``stride=1`` and the same ``episodes``, chunk
    ``i`` belongs to sample ``i``.
    """
    info = as_info(root)
    selected = _check_episodes(info, episodes)
    _check_time_horizon(info, time_horizon, selected)
    if stride < 1:
        raise ValueError(f"stride must be at least 1, got {stride}")
    frames = _read_frames(info, selected, [ACTION])
    rows = np.flatnonzero(frames["frame_in_episode"] % stride == 0)  # [N]
    return _chunks_at(frames, rows, time_horizon)


def chunk_states(root: str | Path | DatasetInfo, *, episodes: list[int] | None = None, stride: int = 1) -> np.ndarray:
    """The state at each chunk's first frame, float32 [N, S], in ``action_chunks``' order (same ``episodes``, ``stride``)."""
    info = as_info(root)
    frames = _read_frames(info, _check_episodes(info, episodes), [OBS_STATE])
    return frames[OBS_STATE][frames["frame_in_episode"] % stride == 0].astype(np.float32, copy=False)


def frame_tasks(root: str | Path | DatasetInfo, *, episodes: list[int] | None = None) -> np.ndarray:
    """int64 [F]: each frame's ``task_index`` over ``episodes`` (None: all), in dataset order, which is the order of
    ``ActionChunkDataset``'s samples (all 0 when the dataset stores no task)."""
    info = as_info(root)
    frames = _read_frames(info, _check_episodes(info, episodes), [])
    return frames.get("task_index", np.zeros(len(frames["index"]))).astype(np.int64)


def state_changes(root: str | Path | DatasetInfo, *, episodes: list[int] | None = None) -> np.ndarray:
    """float64 [F, S]: each frame's state minus the previous frame's in its episode (0 at an episode's first frame),
    over ``episodes`` (None: all): the motion a state history shows."""
    info = as_info(root)
    frames = _read_frames(info, _check_episodes(info, episodes), [OBS_STATE])
    states = frames[OBS_STATE].astype(np.float64)
    return states - states[np.maximum(np.arange(len(states)) - 1, frames["episode_start"])]


def _chunks_at(frames: dict[str, np.ndarray], rows: np.ndarray, time_horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks starting at ``rows`` (positions in dataset order): float32 [N, T, D], bool [N, T]."""
    wanted = rows[:, None] + np.arange(time_horizon)  # [N, T] positions, may run past the episode's end
    last = frames["episode_end"][rows][:, None] - 1  # [N, 1] the episode's last position
    chunks = frames[ACTION][np.minimum(wanted, last)]  # [N, T, D]: past the end, the last action again
    return chunks.astype(np.float32, copy=False), wanted > last
