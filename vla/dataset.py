"""Samples with action chunks for training: a torch ``Dataset`` over a LeRobot v3.0 dataset (the sample contract in
``vla.data``'s docstring), read through LeRobot (images, videos) or from memory (state and actions only).

    ds = ActionChunkDataset(info, 10, episodes=train_eps, image_keys=[])   # a torch.utils.data.Dataset
    sample = ds[0]      # {"observation.state": [S], "task": str, "action": [T, D], "action_is_pad": [T]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data import (
    DatasetInfo,
    _check_episodes,
    _check_image_keys,
    _check_time_horizon,
    _chunks_at,
    _read_frames,
    as_info,
)


def open_dataset(
    root: str | Path | DatasetInfo,
    time_horizon: int,
    *,
    episodes: list[int] | None = None,
    image_keys: list[str] | None = None,
):
    """A ``LeRobotDataset`` over ``root`` whose ``action`` is the chunk of ``time_horizon`` steps.

    Each item holds LeRobot's keys, ``action`` [T, D] and ``action_is_pad`` [T] (``delta_timestamps``).
    ``image_keys`` chooses the cameras decoded and returned (None: all; ``[]``: none, for state-only
    training on a dataset with cameras); the others are dropped from this object's metadata, never from
    the files.
    """
    info = as_info(root)
    selected = _check_episodes(info, episodes)
    _check_time_horizon(info, time_horizon, selected)
    keep = _check_image_keys(info, image_keys)

    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # slow import: only when sampling

    videos = [k for k in info.camera_keys if info.features[k]["dtype"] == "video"]
    missing = [k for k in videos if not any((info.root / "videos" / k).glob("*/*.mp4"))]
    if missing:  # LeRobot would try to download them
        raise ValueError(
            f"{info.root} declares video features {missing} but holds no video files for them, and LeRobot "
            "opens a dataset only with all its videos. Without images, action_chunks() and "
            "ActionChunkDataset(..., image_keys=[], backend='memory') read actions and state."
        )
    dropped = [k for k in info.camera_keys if k not in keep]
    dataset = LeRobotDataset(
        repo_id=f"local/{info.root.name}",  # never contacted: root holds the files
        root=info.root,
        episodes=None if episodes is None else selected,
        delta_timestamps={ACTION: [k / info.fps for k in range(time_horizon)]},
        # With no video to decode, naming a backend skips LeRobot's probe of torchcodec (which prints
        # a traceback where FFmpeg's shared libraries are missing).
        video_backend=None if any(k in keep for k in videos) else "pyav",
    )
    # LeRobot decodes every camera it knows of. Cameras stored as images live in the parquet rows: drop
    # their columns. For every dropped camera, forget its feature (in memory) so no video is decoded.
    images_dropped = [k for k in dropped if k not in videos]
    if images_dropped:
        dataset.reader.hf_dataset = dataset.reader.hf_dataset.remove_columns(images_dropped)
    for key in dropped:
        del dataset.meta.info.features[key]
    return dataset


class ActionChunkDataset(torch.utils.data.Dataset):
    """Samples with action chunks (the contract in this module's docstring); a map-style torch Dataset.

    ``backend="lerobot"`` (default) reads through ``open_dataset``: LeRobot does the reading, clamping and
    padding (and decodes images); this class only renames and converts types. ``backend="memory"`` holds
    state, actions and tasks as arrays and builds the same samples with no per-sample I/O (23 us against
    3.7 ms a sample on a 2-core machine); it serves no images, so it needs ``image_keys=[]`` or a dataset without cameras.
    Both need ``observation.state``; the tests check they give identical samples.
    """

    def __init__(
        self,
        root: str | Path | DatasetInfo,
        time_horizon: int,
        *,
        episodes: list[int] | None = None,
        image_keys: list[str] | None = None,
        backend: str = "lerobot",
    ):
        self.info = as_info(root)
        if self.info.state_dim is None:
            raise ValueError(
                f"{self.info.root} has no '{OBS_STATE}' feature (it has {sorted(self.info.features)}); "
                "the policy's prefix needs the robot state"
            )
        self.time_horizon = time_horizon
        self.image_keys = _check_image_keys(self.info, image_keys)
        self.backend = backend
        if backend == "lerobot":
            self.lerobot = open_dataset(self.info, time_horizon, episodes=episodes, image_keys=self.image_keys)
            self._length = len(self.lerobot)
        elif backend == "memory":
            if self.image_keys:
                raise ValueError(
                    f"backend='memory' serves no images; pass image_keys=[] (cameras: {self.image_keys}) "
                    "or use backend='lerobot'"
                )
            selected = _check_episodes(self.info, episodes)
            _check_time_horizon(self.info, time_horizon, selected)
            self._frames = _read_frames(self.info, selected, [OBS_STATE, ACTION])
            self._length = len(self._frames["index"])
        else:
            raise ValueError(f"backend must be 'lerobot' or 'memory', got {backend!r}")

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.backend == "memory":
            return self._memory_sample(int(i))
        item = self.lerobot[i]
        sample = {
            OBS_STATE: item[OBS_STATE].float().reshape(-1),  # [S]
            "task": item["task"],
            ACTION: item[ACTION].float(),  # [T, D]
            f"{ACTION}_is_pad": item[f"{ACTION}_is_pad"].bool(),  # [T]
        }
        for key in self.image_keys:
            sample[key] = item[key].float()  # [3, H, W] in [0, 1]
        return sample

    def _memory_sample(self, i: int) -> dict[str, Any]:
        if not -self._length <= i < self._length:
            raise IndexError(f"index {i} out of range for {self._length} samples")
        i %= self._length
        chunk, is_pad = _chunks_at(self._frames, np.array([i]), self.time_horizon)
        task_index = self._frames.get("task_index")
        return {
            OBS_STATE: torch.from_numpy(self._frames[OBS_STATE][i].astype(np.float32)),  # [S]
            "task": self.info.tasks[int(task_index[i])] if task_index is not None else "",
            ACTION: torch.from_numpy(chunk[0]),  # [T, D]
            f"{ACTION}_is_pad": torch.from_numpy(is_pad[0]),  # [T]
        }
