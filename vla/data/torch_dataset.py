"""Samples with action chunks for training: a torch ``Dataset`` over a LeRobot v3.0 dataset (the sample contract in
``vla.data.reader``'s docstring), read through LeRobot or from memory.

    ds = ActionChunkDataset(info, 10, episodes=train_eps, image_keys=[])   # a torch.utils.data.Dataset
    sample = ds[0]      # {"observation.state": [S], "task": str, "action": [T, D], "action_is_pad": [T]}
    ds = ActionChunkDataset(info, 10, image_size=64, backend="auto")      # cameras decoded once if they fit

``backend="memory"`` decodes every camera frame once, at construction (PNG frames from the parquet rows, videos with
LeRobot's own PyAV decoder), optionally resized to ``image_size``, and keeps them as uint8 ``[N, 3, H, W]``: no
per-sample I/O afterwards. ``backend="lerobot"`` reads every sample through ``LeRobotDataset``. ``"auto"`` takes
memory when the decoded frames fit ``MEMORY_BUDGET`` bytes, else LeRobot (``choose_backend`` says why).

Videos are decoded with PyAV (``VIDEO_BACKEND``) on both backends: LeRobot's other decoder, torchcodec, needs
FFmpeg's shared libraries, which many machines lack (its import fails), and one decoder gives both backends the same
pixels.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data.columns import _chunks_at
from vla.data.reader import (
    DatasetInfo,
    _check_episodes,
    _check_image_keys,
    _check_time_horizon,
    _read_frames,
    as_info,
    check_frames,
)
from vla.data.videos import check_videos, video_index, video_keys

BACKENDS = ("lerobot", "memory", "auto")
MEMORY_BUDGET = 2 * 1024**3  # bytes of decoded uint8 frames "auto" keeps in memory
VIDEO_BACKEND = "pyav"  # LeRobot's PyAV decoder (see the module docstring)
TOLERANCE_S = 1e-4  # LeRobot's default: a frame's timestamp may be this far from the one asked for


def open_dataset(
    root: str | Path | DatasetInfo,
    time_horizon: int,
    *,
    episodes: list[int] | None = None,
    image_keys: list[str] | None = None,
    obs_steps: int = 1,
):
    """A ``LeRobotDataset`` over ``root`` whose ``action`` is the chunk of ``time_horizon`` steps.

    Each item holds LeRobot's keys, ``action`` [T, D] and ``action_is_pad`` [T] (``delta_timestamps``); with
    ``obs_steps = n`` > 1 also ``observation.state`` [n, S], the last n frames (the first repeated at an episode's
    start).
    ``image_keys`` chooses the cameras decoded and returned (None: all; ``[]``: none, for state-only
    training on a dataset with cameras); the others are dropped from this object's metadata, never from
    the files.
    """
    info = as_info(root)
    selected = _check_episodes(info, episodes)
    _check_time_horizon(info, time_horizon, selected)
    keep = _check_image_keys(info, image_keys)
    # LeRobot opens a dataset only with every video file of the episodes asked for (it would try to download them).
    check_videos(info, None, selected)
    check_frames(info, by_time=True)  # LeRobot finds each chunk's frames by their timestamps

    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # slow import: only when sampling

    videos = video_keys(info)
    dropped = [k for k in info.camera_keys if k not in keep]
    dataset = LeRobotDataset(
        repo_id=f"local/{info.root.name}",  # never contacted: root holds the files
        root=info.root,
        episodes=None if episodes is None else selected,
        delta_timestamps={
            ACTION: [k / info.fps for k in range(time_horizon)],
            **({OBS_STATE: [k / info.fps for k in range(1 - obs_steps, 1)]} if obs_steps > 1 else {}),
        },
        tolerance_s=TOLERANCE_S,
        video_backend=VIDEO_BACKEND,  # also skips LeRobot's probe of torchcodec (a traceback where it cannot load)
    )
    # LeRobot decodes every camera it knows of. Cameras stored as images live in the parquet rows: drop
    # their columns. For every dropped camera, forget its feature (in memory) so no video is decoded.
    images_dropped = [k for k in dropped if k not in videos]
    if images_dropped:
        dataset.reader.hf_dataset = dataset.reader.hf_dataset.remove_columns(images_dropped)
    for key in dropped:
        del dataset.meta.info.features[key]
    return dataset


def frame_bytes(
    root: str | Path | DatasetInfo,
    image_keys: list[str],
    image_size: int | None = None,
    episodes: list[int] | None = None,
) -> int:
    """Bytes of the uint8 frames of ``image_keys`` over ``episodes`` (None: all), each ``image_size`` square (None:
    as stored): what ``backend="memory"`` holds."""
    info = as_info(root)
    image_keys = _check_image_keys(info, image_keys)
    frames = int(info.episode_lengths[np.isin(info.episode_index, _check_episodes(info, episodes))].sum())
    pixels = sum(image_size**2 if image_size else int(np.prod(info.camera_shape(k))) for k in image_keys)
    return frames * pixels * 3


def choose_backend(
    root: str | Path | DatasetInfo,
    image_keys: list[str],
    image_size: int | None = None,
    episodes: list[int] | None = None,
    budget: int = MEMORY_BUDGET,
) -> tuple[str, str]:
    """``("memory" | "lerobot", why)``: memory when the decoded frames fit ``budget`` bytes (always without cameras)."""
    if not image_keys:
        return "memory", "no cameras: actions and state from parquet"
    need = frame_bytes(root, image_keys, image_size, episodes)
    verdict = "fit" if need <= budget else "exceed"
    why = (
        f"{len(image_keys)} camera(s) decoded once: {need / 2**20:.1f} MiB of uint8 frames {verdict} the "
        f"{budget / 2**30:.1f} GiB budget"
    )
    return ("memory" if need <= budget else "lerobot"), why


class ActionChunkDataset(torch.utils.data.Dataset):
    """Samples with action chunks (the contract in this module's docstring); a map-style torch Dataset.

    ``backend="lerobot"`` (default) reads through ``open_dataset``: LeRobot does the reading, clamping and
    padding (and decodes images); this class only renames and converts types. ``backend="memory"`` holds
    state, actions, tasks and the decoded camera frames as arrays and builds the same samples with no per-sample I/O
    (23 us against 3.7 ms a sample without cameras; 55 us against 8.0 ms from PNG and 5.6 ms from video with one
    64 px camera, on a loaded 2-core machine: results/bench_video.json); ``"auto"`` picks one (``choose_backend``;
    ``backend_reason`` says why). ``image_size`` resizes each camera to a square of that side (what the policy reads;
    None keeps the stored size): the memory backend resizes once and stores uint8, so its resized frames are within
    half a grey level of the LeRobot backend's (identical at the stored size). A dataset without
    ``observation.state`` gives samples without it (an image-only policy). The tests check both give the same samples.
    """

    def __init__(
        self,
        root: str | Path | DatasetInfo,
        time_horizon: int,
        *,
        episodes: list[int] | None = None,
        image_keys: list[str] | None = None,
        image_size: int | None = None,
        backend: str = "lerobot",
        progress: bool = True,
        obs_steps: int = 1,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if image_size is not None and image_size < 1:
            raise ValueError(f"image_size is a positive number of pixels or None (as stored), got {image_size}")
        self.info = as_info(root)
        self.time_horizon = time_horizon
        if obs_steps < 1:
            raise ValueError(f"obs_steps is the number of state frames a sample holds (>= 1), got {obs_steps}")
        self.obs_steps = obs_steps
        self.image_keys = _check_image_keys(self.info, image_keys)
        self.image_size = image_size
        selected = _check_episodes(self.info, episodes)
        _check_time_horizon(self.info, time_horizon, selected)
        self.episodes = selected  # the episodes whose frames are the samples, in dataset order
        self.backend_reason = f"backend={backend!r} asked for"
        if backend == "auto":
            backend, self.backend_reason = choose_backend(self.info, self.image_keys, image_size, selected)
        self.backend = backend
        self._state = self.info.state_dim is not None
        if backend == "lerobot":
            self.lerobot = open_dataset(
                self.info, time_horizon, episodes=episodes, image_keys=self.image_keys, obs_steps=obs_steps
            )
            self._length = len(self.lerobot)
        else:
            check_videos(self.info, self.image_keys, selected)  # before any decoding: nothing done in vain
            check_frames(self.info, by_time=any(k in video_keys(self.info) for k in self.image_keys))  # video: by time
            vectors = [OBS_STATE, ACTION] if self._state else [ACTION]
            videos = [k for k in self.image_keys if k in video_keys(self.info)]
            columns = (("timestamp",) if videos else ()) + tuple(k for k in self.image_keys if k not in videos)
            self._frames = _read_frames(self.info, selected, vectors, columns)
            self._length = len(self._frames["index"])
            self._images = {key: self._decode(key, progress) for key in self.image_keys}  # uint8 [N, 3, H, W]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.backend == "memory":
            return self._memory_sample(int(i))
        item = self.lerobot[i]
        sample = {
            "task": item["task"],
            ACTION: item[ACTION].float(),  # [T, D]
            f"{ACTION}_is_pad": item[f"{ACTION}_is_pad"].bool(),  # [T]
        }
        if self._state:
            state = item[OBS_STATE].float()
            sample[OBS_STATE] = state if self.obs_steps > 1 else state.reshape(-1)  # [S] or [n, S]
        for key in self.image_keys:
            sample[key] = _resized(item[key].float(), key, self.image_size)  # [3, H, W] in [0, 1]
        return sample

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """The samples at ``indices`` (what a DataLoader's batch asks for): the memory backend slices every array once
        for the whole batch instead of once per sample; the samples are the ones ``__getitem__`` gives."""
        if self.backend != "memory" or self.obs_steps > 1 or not len(indices):
            return [self[i] for i in indices]
        rows = np.asarray(indices, dtype=np.int64)
        if ((rows < -self._length) | (rows >= self._length)).any():
            bad = int(rows[(rows < -self._length) | (rows >= self._length)][0])
            raise IndexError(f"index {bad} out of range for {self._length} samples")
        rows %= self._length
        chunks, is_pad = _chunks_at(self._frames, rows, self.time_horizon)  # [n, T, D], [n, T]
        chunks, is_pad = torch.from_numpy(np.ascontiguousarray(chunks)), torch.from_numpy(is_pad)
        task_index = self._frames.get("task_index")
        tasks = [self.info.tasks[int(t)] for t in task_index[rows]] if task_index is not None else [""] * len(rows)
        columns = {ACTION: chunks, f"{ACTION}_is_pad": is_pad}
        if self._state:
            columns[OBS_STATE] = torch.from_numpy(self._frames[OBS_STATE][rows].astype(np.float32))
        index = torch.from_numpy(rows)
        for key, frames in self._images.items():
            columns[key] = frames.index_select(0, index).float() / 255  # [n, 3, H, W] in [0, 1]
        return [{"task": task, **{k: v[j] for k, v in columns.items()}} for j, task in enumerate(tasks)]

    def _memory_sample(self, i: int) -> dict[str, Any]:
        if not -self._length <= i < self._length:
            raise IndexError(f"index {i} out of range for {self._length} samples")
        i %= self._length
        chunk, is_pad = _chunks_at(self._frames, np.array([i]), self.time_horizon)
        task_index = self._frames.get("task_index")
        sample = {
            "task": self.info.tasks[int(task_index[i])] if task_index is not None else "",
            ACTION: torch.from_numpy(chunk[0]),  # [T, D]
            f"{ACTION}_is_pad": torch.from_numpy(is_pad[0]),  # [T]
        }
        if self._state:
            row = i  # [S]; a history: [n, S], the episode's first frame repeated before it starts
            if self.obs_steps > 1:
                row = np.maximum(i + np.arange(1 - self.obs_steps, 1), self._frames["episode_start"][i])
            sample[OBS_STATE] = torch.from_numpy(self._frames[OBS_STATE][row].astype(np.float32))
        for key, frames in self._images.items():
            sample[key] = frames[i].float() / 255  # [3, H, W] in [0, 1], LeRobot's conversion
        return sample

    # --- decoding every frame once (the memory backend) ----------------------------------------------------
    def _decode(self, key: str, progress: bool) -> torch.Tensor:
        """Camera ``key``'s frames in sample order, uint8 [N, 3, H, W] (resized to ``image_size`` when set)."""
        from tqdm.auto import tqdm

        h, w = self.info.camera_shape(key)
        size = (self.image_size, self.image_size) if self.image_size else (h, w)
        out = torch.empty((self._length, 3, *size), dtype=torch.uint8)
        starts = np.flatnonzero(self._frames["frame_in_episode"] == 0)  # [E] each episode's first row
        video = key in video_keys(self.info)
        where = _episode_videos(self.info, key) if video else None
        for start in tqdm(
            starts, desc=f"decode {key.rsplit('.', 1)[-1]}", unit="ep", disable=not progress, leave=False
        ):
            rows = slice(int(start), int(self._frames["episode_end"][start]))
            if video:
                path, offset = where[int(self._frames["episode_index"][start])]
                frames = _video_frames(path, offset + self._frames["timestamp"][rows].astype(np.float64))
            else:
                frames = torch.from_numpy(np.stack([_png(cell, key) for cell in self._frames[key][rows]]))
                frames = frames.permute(0, 3, 1, 2)  # [n, H, W, 3] -> [n, 3, H, W]
            if frames.shape[-2:] != (h, w):
                raise ValueError(
                    f"{self.info.root}: camera {key} holds {tuple(frames.shape[-2:])} frames but "
                    f"meta/info.json says {h}x{w}; the dataset is inconsistent"
                )
            out[rows] = frames if size == (h, w) else _to_uint8(_resized(frames.float() / 255, key, self.image_size))
        self._frames.pop(key, None)  # the PNG bytes are no longer needed
        return out


def _resized(image: torch.Tensor, key: str, size: int | None) -> torch.Tensor:
    """float ``[3, H, W]`` or ``[n, 3, H, W]`` -> the same at ``size`` x ``size`` (the pipeline's own resize)."""
    if size is None or image.shape[-2:] == (size, size):
        return image
    from vla.policy.images import camera_image

    batch = image if image.ndim == 4 else image[None]
    out = camera_image(batch, key, len(batch), size)
    return out if image.ndim == 4 else out[0]


def _to_uint8(image: torch.Tensor) -> torch.Tensor:
    return (image * 255).round_().clamp_(0, 255).to(torch.uint8)


def _png(cell: Any, key: str) -> np.ndarray:
    """A PNG camera's parquet cell (``{"bytes", "path"}``) -> uint8 [H, W, 3]."""
    from PIL import Image

    data = cell.get("bytes") if isinstance(cell, dict) else None
    if data is None:
        raise ValueError(
            f"camera {key} has a frame without embedded PNG bytes ({cell!r}); LeRobot v3.0 datasets "
            "embed their frames: convert or record the dataset again"
        )
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def _episode_videos(info: DatasetInfo, key: str) -> dict[int, tuple[Path, float]]:
    """episode id -> (its video file for camera ``key``, its first frame's time in that file)."""
    index = video_index(info, key)
    return {int(e): (p, float(t)) for e, p, t in zip(index["episode_index"], index["path"], index["from_timestamp"])}


def _video_frames(path: Path, timestamps: np.ndarray) -> torch.Tensor:
    """The frames at ``timestamps`` (seconds into ``path``), uint8 [n, 3, H, W], by LeRobot's own decoder: the frames
    the LeRobot backend returns."""
    from lerobot.datasets.video_utils import decode_video_frames

    return decode_video_frames(path, timestamps.tolist(), TOLERANCE_S, VIDEO_BACKEND, return_uint8=True)
