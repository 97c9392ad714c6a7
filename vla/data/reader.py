"""LeRobot v3.0 datasets in: what a dataset holds, fast chunk extraction, splits (statistics: ``vla.data.stats``;
video files: ``vla.data.videos``).

Everything reads a local dataset folder (``root``, the one holding ``meta/`` and ``data/``), offline.

    info = dataset_info(root)                      # fps, episode lengths, features, cameras, dims
    chunks, is_pad = action_chunks(root, 15)       # float32 [N, 15, D], bool [N, 15]: no images decoded
    train_eps, heldout_eps = split_episodes(root, heldout=0.2, seed=0)
    stats = vla.data.stats.frame_stats(root, ["action"], episodes=train_eps)   # exact quantiles, from the frames
    ds = vla.data.torch_dataset.ActionChunkDataset(info, 15, episodes=train_eps)   # torch Dataset of samples

The sample contract (one frame, unbatched; a DataLoader adds the batch dimension):

    "observation.state"            float32 [S]      (absent when the dataset has no state: an image-only policy;
                                   float32 [n, S]   with obs_steps = n > 1: the last n frames, oldest first, the
                                                    episode's first repeated before it starts, as LeRobot pads)
    "observation.images.<camera>"  float32 [3, H, W] in [0, 1]   one per camera kept (none for state-only data)
    "task"                         str
    "action"                       float32 [T, D]   actions t .. t+T-1 of the frame's episode
    "action_is_pad"                bool [T]         True where t+k is past the episode's end

Past an episode's end, LeRobot (``delta_timestamps``) repeats the episode's last action and flags it in
``action_is_pad``; ``action_chunks`` does exactly the same, so both paths give identical chunks.
Every function takes a dataset folder or the ``DatasetInfo`` read from it (``meta/`` read once). This module
reads parquet with pyarrow; ``vla.data.torch_dataset`` serves samples (through LeRobot, or decoded once into memory).

Cameras are stored as LeRobot stores them: ``"video"`` features (one MP4 per camera per file of episodes, LeRobot's
default, AV1) or ``"image"`` features (PNG frames inside the parquet rows: exact pixels); ``vla.data.videos.check_videos``
finds the video files a dataset's episode table names but the folder lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from lerobot.utils.constants import ACTION, OBS_IMAGES, OBS_STATE

from vla.data import meta
from vla.io import read_json
from vla.names import suggestion

IMAGE_PREFIX = OBS_IMAGES + "."  # camera keys: observation.images.<camera> (the one definition)
CODEBASE_VERSION = "v3.0"
RECORDING_FILE = "meta/recording.json"  # written by vla.sim.record, absent elsewhere
RECORDING_FORMAT = 2  # 2: several tasks per dataset ("tasks", "episodes_per_task")
_NUMERIC_DTYPES = {
    "bool",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
}
_CAMERA_DTYPES = {"image", "video"}


# -- what a dataset holds --------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds, read from ``meta/`` (nothing under ``data/`` is opened)."""

    root: Path
    fps: int
    episode_index: np.ndarray  # int64 [E], the dataset's episode ids in order
    episode_lengths: np.ndarray  # int64 [E], frames per episode
    features: dict[str, dict]  # name -> {"dtype", "shape", "names"} from meta/info.json
    camera_keys: list[str]  # "observation.images.*" features stored as images or videos
    action_dim: int
    state_dim: int | None  # None when the dataset has no observation.state
    action_names: (
        list[str] | None
    )  # one per action dim (any layout in meta/info.json read flat: vla.data.meta.flat_names)
    tasks: list[str]  # by task_index
    robot_type: str | None = None
    recording: dict | None = field(default=None, repr=False)  # meta/recording.json from vla.sim.record
    video_path: str | None = None  # meta/info.json's template of a video file's path (None: no videos)
    state_names: list[str] | None = None  # one per state dim, or None
    notes: tuple[str, ...] = ()  # what in meta/ was odd and worked around (names ignored), for `vla data info`
    data_files: np.ndarray | None = field(default=None, repr=False)  # [E] each episode's data file (None: not listed)

    @property
    def num_episodes(self) -> int:
        return len(self.episode_index)

    @cached_property
    def frame_check(self) -> FrameCheck:
        """The data rows checked against ``meta/`` (their index columns read once, on first use)."""
        return FrameCheck.read(self)

    @property
    def num_frames(self) -> int:
        return int(self.episode_lengths.sum())

    def camera_shape(self, key: str) -> tuple[int, int]:
        """A camera's stored (height, width) in pixels."""
        feature = self.features[key]
        shape, names = list(feature["shape"]), feature.get("names") or []
        if len(shape) == 3 and names[:1] == ["channels"]:  # LeRobot allows [C, H, W] too
            return int(shape[1]), int(shape[2])
        return int(shape[0]), int(shape[1])

    def camera_text(self, key: str) -> str:
        """``key 64x64 video (av1)`` or ``key 64x64 png``: a camera, its size and how it is stored."""
        feature = self.features[key]
        h, w = self.camera_shape(key)
        if feature["dtype"] == "video":
            codec = (feature.get("info") or {}).get("video.codec")
            return f"{key} {h}x{w} video" + (f" ({codec})" if codec else "")
        return f"{key} {h}x{w} png"

    def describe(self) -> str:
        """A few human-readable lines (for the CLI)."""
        lengths = self.episode_lengths
        lines = [
            f"{self.root}: {self.num_episodes} episodes, {self.num_frames} frames at {self.fps} fps",
            f"  episode length: min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}",
            f"  action: {self.action_dim}-D {self.action_names or ''}".rstrip(),
            f"  state: {self.state_dim}-D {self.state_names or ''}".rstrip()
            if self.state_dim is not None
            else "  state: none",
            f"  cameras: {', '.join(self.camera_text(k) for k in self.camera_keys) or 'none'}",
            f"  tasks: {'; '.join(self.tasks[:3])}{' ...' if len(self.tasks) > 3 else ''}",
        ]
        lines += [f"  NOTE: {note}" for note in self.notes]
        if self.recording:
            lines.append(
                f"  recorded from {self.recording.get('env')} {self.recording.get('task')}: expert success "
                f"{self.recording.get('expert_success_rate', float('nan')):.1%} over "
                f"{self.recording.get('attempts')} attempts"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class FrameCheck:
    """The data rows against ``meta/``, from their index columns only (``episode_index``, ``task_index``,
    ``timestamp``): ``errors`` make the frames unusable (a ``task_index`` that ``meta/tasks.parquet`` does not list,
    an episode whose rows disagree with the episode table's length), ``timestamps`` names the episodes whose
    timestamps are all equal (harmless where frames are read by row, wrong where they are found by time: LeRobot's
    reader, video frames)."""

    errors: tuple[str, ...]
    timestamps: str | None

    @classmethod
    def read(cls, info: DatasetInfo) -> FrameCheck:
        import pyarrow as pa

        columns = ["episode_index"] + [c for c in ("task_index", "timestamp") if c in info.features]
        files = sorted((info.root / "data").glob("*/*.parquet"))
        table = pa.concat_tables([meta.read_parquet(path, columns=columns) for path in files])
        episode_of = table.column("episode_index").to_numpy()
        ids, counts = np.unique(episode_of, return_counts=True)
        held = dict(zip(ids.tolist(), counts.tolist()))
        listed = zip(info.episode_index.tolist(), info.episode_lengths.tolist())
        wrong = [(e, n, held.get(e, 0)) for e, n in listed if held.get(e, 0) != n]
        errors = []
        if wrong:
            (episode, said, rows), more = wrong[0], len(wrong) - 1
            others = f" ({more} more episodes disagree)" if more else ""
            errors.append(
                f"{info.root}: meta/episodes says episode {episode} has {said} frames but the data holds {rows}"
                f"{others}; the episode table does not match the data: {meta.REDOWNLOAD}"
            )
        if "task_index" in info.features:
            task_index = table.column("task_index").to_numpy()
            bad = (task_index < 0) | (task_index >= len(info.tasks))
            if bad.any():
                unknown = ", ".join(str(t) for t in sorted(set(task_index[bad].tolist()))[:5])
                episodes = episode_ranges(sorted(set(episode_of[bad].tolist())))
                tasks = f"lists task_index 0..{len(info.tasks) - 1}" if info.tasks else "is missing"
                errors.append(
                    f"{info.root}: the data's task_index {unknown} (episodes {episodes}) names no task: "
                    f"meta/tasks.parquet {tasks}; restore meta/tasks.parquet or {meta.REDOWNLOAD}"
                )
        timestamps = None
        if "timestamp" in info.features:
            time = table.column("timestamp").to_numpy().astype(np.float64)
            frozen = [e for e in ids.tolist() if held[e] > 1 and np.ptp(time[episode_of == e]) == 0]
            if frozen:
                first = float(time[episode_of == frozen[0]][0])
                timestamps = (
                    f"episodes {episode_ranges(frozen)}: every frame has the same timestamp ({first:g} s) instead of "
                    f"frame_index / fps ({1 / info.fps:g} s apart), so frames found by time (LeRobot's reader, "
                    f"videos) would all be the first: fix the timestamps or {meta.REDOWNLOAD}"
                )
        return cls(tuple(errors), timestamps)


def check_frames(root: str | Path | DatasetInfo, *, by_time: bool = False) -> str | None:
    """A ``ValueError`` (the first problem, one line) when the data rows disagree with ``meta/`` (``FrameCheck``);
    with ``by_time`` (frames found by their timestamps) equal timestamps in an episode too. Returns the note on equal
    timestamps otherwise (None when there is none)."""
    check = as_info(root).frame_check
    if check.errors:
        raise ValueError(check.errors[0])
    if by_time and check.timestamps:
        raise ValueError(f"{as_info(root).root}: {check.timestamps}")
    return check.timestamps


def as_info(source: str | Path | DatasetInfo) -> DatasetInfo:
    """A ``DatasetInfo`` as it is, or read from a dataset folder: pass one around to read ``meta/`` once."""
    return source if isinstance(source, DatasetInfo) else dataset_info(source)


def dataset_info(root: str | Path) -> DatasetInfo:
    """Read ``meta/info.json``, the episode table and the tasks (``vla.data.meta``: every field checked where it is read);
    check the dataset is usable.

    Raises ValueError for a missing folder, a folder that is not a LeRobot v3.0 dataset, a bad field of
    ``meta/info.json`` (named, with the fix), no ``action`` feature, or a non-numeric ``action``/``observation.state``.
    """
    root = _check_root(root)
    info = meta.InfoFile.read(root)
    version = info.version
    if version != CODEBASE_VERSION:
        hint = "`vla data convert SRC DST`" if version == "v2.1" else "LeRobot's converters, one version at a time"
        raise ValueError(
            f"{root} is a LeRobot {version} dataset; this reads {CODEBASE_VERSION} only. Convert it with {hint}"
        )
    features = info.features()
    _check_numeric(root, features, ACTION, required=True)
    _check_numeric(root, features, OBS_STATE, required=False)
    cameras = [k for k, ft in features.items() if ft["dtype"] in _CAMERA_DTYPES]
    for key in cameras:
        if len(features[key]["shape"]) != 3:
            raise info.bad(
                f"features.{key}.shape",
                features[key]["shape"],
                "a camera's [height, width, 3] (or [3, height, width] with names starting 'channels')",
            )

    episodes = meta.episode_table(root, info.text("data_path"))
    return DatasetInfo(
        root=root,
        fps=info.fps(),
        episode_index=episodes["episode_index"],
        episode_lengths=episodes["length"],
        features=features,
        camera_keys=cameras,
        action_dim=int(np.prod(features[ACTION]["shape"])),
        state_dim=int(np.prod(features[OBS_STATE]["shape"])) if OBS_STATE in features else None,
        action_names=features[ACTION]["names"],
        tasks=meta.read_tasks(root),
        robot_type=info.text("robot_type"),
        recording=read_recording(root),
        video_path=info.text("video_path"),
        state_names=features[OBS_STATE]["names"] if OBS_STATE in features else None,
        notes=tuple(info.notes),
        data_files=episodes.get("data_file"),
    )


def read_recording(root: str | Path) -> dict[str, Any] | None:
    """``meta/recording.json`` of a dataset ``record`` made, or None for a dataset made elsewhere."""
    path = Path(root) / RECORDING_FILE
    if not path.is_file():
        return None
    content = read_json(path, "recording")
    content.setdefault("format_version", content.pop("format", 1))  # files before the rename
    if content["format_version"] == 1:  # one task per dataset
        content.setdefault("episodes_per_task", content.get("episodes"))
        content.setdefault("env_options", {})
        content["format_version"] = RECORDING_FORMAT
    if content["format_version"] != RECORDING_FORMAT:
        raise ValueError(
            f"{path} has format_version {content['format_version']!r}; this version reads "
            f"{RECORDING_FORMAT}: record the dataset again"
        )
    return content


def nonfinite(frames: dict[str, np.ndarray], features: list[str]) -> dict[str, str]:
    """Per feature holding NaN or inf (of frames ``_read_frames`` read): how many values, and where the first is."""
    out = {}
    for name in features:
        bad = ~np.isfinite(frames[name].astype(np.float64))
        if bad.any():
            row = int(np.flatnonzero(bad.any(axis=1))[0])
            out[name] = (
                f"{int(bad.sum())} values in {int(bad.any(axis=1).sum())} frames, the first in episode "
                f"{int(frames['episode_index'][row])} at frame {int(frames['frame_in_episode'][row])}"
            )
    return out


def damaged_files(root: str | Path | DatasetInfo) -> dict[Path, str]:
    """Every data file that is not a readable parquet file (its footer is read), with the episodes it holds by the
    episode table (``"episodes 0-54"``; ``"episodes unknown"`` when the table does not say) and why: empty when every
    file reads. A file the episode table names but the folder lacks is listed too."""
    info = as_info(root)
    held: dict[Path, list[int]] = {}
    if info.data_files is not None:
        for episode, name in zip(info.episode_index.tolist(), info.data_files):
            held.setdefault(info.root / name, []).append(int(episode))
    out = {}
    for path in sorted(set((info.root / "data").glob("*/*.parquet")) | set(held)):
        why = "missing" if not path.is_file() else meta.damaged_parquet(path)
        if why is not None:
            episodes = held.get(path)
            out[path] = f"episodes {episode_ranges(episodes)}" if episodes else "episodes unknown"
            out[path] += f" ({why})"
    return out


def check_files(root: str | Path | DatasetInfo) -> None:
    """A ``ValueError`` naming the damaged or missing data files and the episodes they hold (``damaged_files``)."""
    info = as_info(root)
    bad = damaged_files(info)
    if bad:
        listed = "; ".join(f"{p.relative_to(info.root)}: {why}" for p, why in list(bad.items())[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(
            f"{info.root}: {len(bad)} data file(s) cannot be read ({listed}{more}); {meta.REDOWNLOAD} "
            "(those episodes' files at least)"
        )


def check_values(root: str | Path | DatasetInfo) -> dict[str, str]:
    """NaN/inf in the dataset's action and state, by feature (empty when clean): what ``vla data info`` reports."""
    info = as_info(root)
    features = [f for f in (ACTION, OBS_STATE) if f in info.features]
    return nonfinite(_read_frames(info, info.episode_index.tolist(), features), features)


def split_episodes(root: str | Path | DatasetInfo, heldout: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
    """Split the episodes into (train, held-out) lists, seeded; at least one of each when ``heldout > 0``.

    ``heldout`` is the held-out fraction in [0, 1). Both lists are sorted episode indices.
    """
    if not 0.0 <= heldout < 1.0:
        raise ValueError(f"heldout is a fraction in [0, 1), got {heldout}")
    episodes = as_info(root).episode_index
    if heldout == 0.0:
        return sorted(episodes.tolist()), []
    if len(episodes) < 2:
        raise ValueError(f"{root} has {len(episodes)} episode(s): a held-out split needs at least 2")
    n_heldout = min(max(1, round(heldout * len(episodes))), len(episodes) - 1)
    order = np.random.default_rng(seed).permutation(episodes)
    return sorted(order[n_heldout:].tolist()), sorted(order[:n_heldout].tolist())


# -- checks and readers ----------------------------------------------------------------------------


def _check_root(root: str | Path) -> Path:
    root = Path(root).expanduser()
    if not root.exists():
        raise ValueError(
            f"no dataset at {root}: the folder does not exist. Pass the folder that holds meta/ and data/, "
            "or record one with `vla data record --root <dir>`."
        )
    if not (root / "meta" / "info.json").is_file():
        inner = sorted(p.parent.parent for p in root.glob("*/meta/info.json"))
        hint = f" Did you mean {inner[0]}?" if inner else ""
        raise ValueError(f"{root} is not a LeRobot dataset: {root / 'meta' / 'info.json'} is missing.{hint}")
    if not any((root / "data").glob("*/*.parquet")):
        raise ValueError(f"{root} holds no data files (data/chunk-*/file-*.parquet); the recording is incomplete")
    return root


def _check_numeric(root: Path, features: dict, key: str, *, required: bool) -> None:
    if key not in features:
        if required:
            raise ValueError(f"{root} has no '{key}' feature (it has {sorted(features)}); policies train on '{key}'")
        return
    dtype = features[key].get("dtype")
    if dtype not in _NUMERIC_DTYPES:
        raise ValueError(f"'{key}' in {root} has dtype {dtype!r}; it must be numeric (float or int)")


def _check_episodes(info: DatasetInfo, episodes: list[int] | None) -> list[int]:
    """The selected episode ids (all when None), validated."""
    known = info.episode_index.tolist()
    if episodes is None:
        return known
    selected = [int(e) for e in episodes]
    if not selected:
        raise ValueError("episodes is empty; pass None for all episodes")
    unknown = sorted(set(selected) - set(known))
    if unknown:
        raise ValueError(
            f"episodes {unknown[:10]} are not in {info.root} (it has {len(known)} episodes, "
            f"ids {min(known)}..{max(known)})"
        )
    return sorted(set(selected))


def _check_time_horizon(info: DatasetInfo, time_horizon: int, episodes: list[int]) -> None:
    """A chunk no longer than the dataset's longest episode. Selected episodes shorter than it are padded, as every
    episode's last chunks are: a split (the held-out episodes of one seed) may hold only short ones, and the chunk,
    chosen for the whole dataset, stays the same for every split."""
    if not isinstance(time_horizon, (int, np.integer)) or time_horizon < 1:
        raise ValueError(f"time_horizon must be a positive integer, got {time_horizon!r}")
    longest = int(info.episode_lengths.max())
    if time_horizon > longest:
        raise ValueError(
            f"time_horizon {time_horizon} is longer than every episode (longest: {longest} frames at {info.fps} "
            f"fps); every chunk would be mostly padding. Use at most {longest}."
        )


def _check_image_keys(info: DatasetInfo, image_keys: list[str] | None) -> list[str]:
    if image_keys is None:
        return list(info.camera_keys)
    keys = list(image_keys)
    for key in keys:
        if key not in info.camera_keys:
            raise ValueError(
                f"{key!r} is not a camera of {info.root}{suggestion(key, info.camera_keys)} "
                f"(cameras present: {', '.join(info.camera_keys) or 'none'})"
            )
    return keys


def _read_frames(
    info: DatasetInfo, episodes: list[int], vectors: list[str], columns: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
    """The chosen episodes' frames in dataset order: each feature in ``vectors`` as numpy [F, dim], each of
    ``columns`` as it is stored ([F]: a PNG camera's rows are ``{"bytes", "path"}`` dicts), plus ``episode_index``,
    ``task_index`` (when present) [F], and per frame the position of its episode's first frame (``episode_start``),
    one past its last (``episode_end``) and ``frame_in_episode``, all [F]."""
    import pyarrow as pa
    import pyarrow.compute as pc

    check_frames(info)  # rows that disagree with meta/ are refused before anything is built from them
    scalars = ["index", "episode_index"] + (["task_index"] if "task_index" in info.features else [])
    tables = []
    for path in sorted((info.root / "data").glob("*/*.parquet")):
        table = meta.read_parquet(path, columns=vectors + scalars + list(columns))
        keep = pc.is_in(table.column("episode_index"), value_set=pa.array(episodes, pa.int64()))
        tables.append(table.filter(keep))
    table = pa.concat_tables(tables)
    order = np.argsort(table.column("index").to_numpy(), kind="stable")  # dataset order, whatever the files
    frames = {name: table.column(name).to_numpy()[order] for name in scalars}
    for name in columns:
        frames[name] = table.column(name).to_numpy(zero_copy_only=False)[order]
    for name in vectors:
        dim = int(np.prod(info.features[name]["shape"]))
        frames[name] = _fixed_size_column(table.column(name).combine_chunks(), dim, name)[order]

    # An episode's frames are contiguous in dataset order: find where each run starts and ends.
    episode_of = frames["episode_index"]
    n = len(episode_of)
    breaks = np.flatnonzero(np.diff(episode_of) != 0) + 1
    starts, ends = np.concatenate([[0], breaks]), np.concatenate([breaks, [n]])
    frames["episode_start"] = np.repeat(starts, ends - starts)  # [F]
    frames["episode_end"] = np.repeat(ends, ends - starts)  # [F]
    frames["frame_in_episode"] = np.arange(n) - frames["episode_start"]  # [F]
    return frames


def _fixed_size_column(column, dim: int, name: str) -> np.ndarray:
    """An arrow list column of ``dim`` numbers per row -> numpy [rows, dim]."""
    import pyarrow as pa

    if column.null_count:
        raise ValueError(f"'{name}' has {column.null_count} missing rows")
    values = column.flatten()  # respects offsets and slices
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"'{name}' holds {values.type} values; it must be numeric")
    if len(values) != len(column) * dim:
        raise ValueError(f"'{name}' rows do not all have {dim} values as meta/info.json says")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), dim)


def episode_ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, ids = [], sorted(ids)
    for i in ids:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)
