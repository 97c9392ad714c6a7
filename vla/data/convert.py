"""``vla data convert SRC DST``: a LeRobot v2.1 dataset (``meta/*.jsonl``, one parquet per episode) -> a new v3.0
dataset at ``DST``, which ``vla`` and LeRobot 0.6 read. ``SRC`` is left as it is, and nothing is downloaded.

    summary = convert("old/so100_pick", "datasets/so100_pick")   # {"episodes", "frames", "dropped", ...}

The conversion is LeRobot's own (``lerobot/scripts/convert_dataset_v21_to_v30.py``: its ``convert_info``,
``convert_tasks``, ``convert_data``, ``convert_videos``, ``convert_episodes_metadata``), called on a local folder;
around it, two things that script does not do:

* a camera stored as video whose files are absent (an info.json listing ``observation.images.<cam>`` as
  ``video`` with no ``videos/`` folder, as a copy without videos has) makes LeRobot's converter fail half-way.
  Such cameras are dropped, named in the summary and logged; a camera with only some of its files is an error.
* the result is written to a hidden sibling folder of ``DST`` and renamed into place at the end, so a failed
  conversion leaves no half-written ``DST`` (LeRobot's converter works in place, in ``SRC``'s own folder).

and, before anything is written, a pre-flight: ``meta/info.json`` read through ``vla.data.meta`` (every field checked),
``DST`` neither ``SRC`` nor inside or around it, and the episodes ``meta/episodes.jsonl`` lists checked against the
data files (LeRobot's converter numbers the files it finds, so one missing file fails late as "Number of episodes is
not the same"); a missing, extra or damaged file is named. Feature names in any layout (a list holding one list, a
dict of lists) are written flat (``vla.data.meta.flat_names``).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from vla.data import meta
from vla.io import atomic_directory, read_json, write_json

logger = logging.getLogger(__name__)

V21, V30 = "v2.1", "v3.0"
# What a v2.1 dataset's meta folder holds (LeRobot's LEGACY_*_PATH).
LEGACY_META = ("info.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl")


def convert(src: str | Path, dst: str | Path, *, overwrite: bool = False, log=logger.info) -> dict[str, Any]:
    """Convert the v2.1 dataset at ``src`` into a new v3.0 dataset at ``dst``; return a summary (``dst``,
    ``episodes``, ``frames``, ``features``, ``dropped``: the cameras left out because their videos are absent)."""
    src, dst = Path(src), Path(dst)
    info = _check_source(src)
    _check_destination(src, dst)
    if dst.exists() and not overwrite:
        raise ValueError(f"{dst} already exists; choose another destination or pass --overwrite to replace it")
    _check_episode_files(src, info)
    dropped = _absent_video_features(src, info)
    if dropped:
        log(
            f"dropping camera features whose videos are absent from {src / 'videos'}: {', '.join(dropped)} (the "
            "converted dataset has no such camera; copy the videos/ folder beside meta/ to keep them)"
        )

    from lerobot.scripts import convert_dataset_v21_to_v30 as lerobot_convert  # slow import: only when converting
    from lerobot.utils.utils import SuppressProgressBars

    with tempfile.TemporaryDirectory(prefix="vla-convert-") as staging, atomic_directory(dst) as out:
        view = _source_view(src, Path(staging) / "src", info, dropped)
        data_mb, video_mb = lerobot_convert.DEFAULT_DATA_FILE_SIZE_IN_MB, lerobot_convert.DEFAULT_VIDEO_FILE_SIZE_IN_MB
        with SuppressProgressBars():
            lerobot_convert.convert_info(view, out, data_mb, video_mb)
            lerobot_convert.convert_tasks(view, out)
            episodes = lerobot_convert.convert_data(view, out, data_mb)
            videos = lerobot_convert.convert_videos(view, out, video_mb)
            lerobot_convert.convert_episodes_metadata(view, out, episodes, videos)
        new_info = read_json(out / "meta" / "info.json", "converted dataset info")
    summary = {
        "src": str(src),
        "dst": str(dst),
        "episodes": len(episodes),
        "frames": int(new_info.get("total_frames", 0)),
        "features": sorted(new_info["features"]),
        "dropped": dropped,
    }
    log(f"converted {src} (v2.1) -> {dst} (v3.0): {summary['episodes']} episodes, {summary['frames']} frames")
    return summary


def _check_source(src: Path) -> dict[str, Any]:
    """meta/info.json as a dict (features with flat names), every field this module reads checked."""
    if not (src / "meta" / "info.json").is_file():
        raise ValueError(f"{src} is not a LeRobot dataset (no meta/info.json); pass the folder holding meta/ and data/")
    file = meta.InfoFile.read(src)
    version = file.version
    if version == V30:
        raise ValueError(f"{src} is already a {V30} dataset; use it as it is")
    if version != V21:
        raise ValueError(
            f"{src} is a {version!r} dataset; vla data convert converts {V21} only (LeRobot's own "
            "converters handle older versions step by step: v2.0 -> v2.1 first)"
        )
    missing = [f"meta/{name}" for name in LEGACY_META if not (src / "meta" / name).is_file()]
    if missing:
        raise ValueError(f"{src} lacks {', '.join(missing)}, which every {V21} dataset has; copy the whole dataset")
    if not any((src / "data").glob("*/*.parquet")):
        raise ValueError(f"{src / 'data'} holds no parquet files (data/chunk-000/episode_000000.parquet, ...)")
    file.fps()
    for name in ("total_episodes", "chunks_size"):
        file.count(name, default=1000 if name == "chunks_size" else None)
    for name in ("data_path", "video_path"):
        file.text(name)
    info = dict(file.raw, features=file.features())
    for note in file.notes:
        logger.warning(note)
    return info


def _check_destination(src: Path, dst: Path) -> None:
    """``dst`` must be a folder of its own: not ``src``, not inside it (the result would land in the source dataset's
    folder and be read as part of it), not around it (``--overwrite`` would delete the source)."""
    s, d = src.resolve(), dst.resolve()
    if d == s:
        raise ValueError(f"the destination is the source ({src}); convert into a new folder beside it")
    if d.is_relative_to(s):
        raise ValueError(
            f"the destination {dst} is inside the source dataset {src}; convert into a folder outside "
            f"it (e.g. {src.parent / (src.name + '_v30')})"
        )
    if s.is_relative_to(d):
        raise ValueError(
            f"the destination {dst} holds the source dataset {src}; convert into a new folder beside it "
            f"(e.g. {src.parent / (src.name + '_v30')})"
        )


def _listed_episodes(src: Path) -> list[int]:
    """The episode ids meta/episodes.jsonl lists, each line checked."""
    path = src / "meta" / "episodes.jsonl"
    ids = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} line {number} is not valid JSON ({err.msg}); fix the file or download the dataset again"
            ) from None
        episode = entry.get("episode_index") if isinstance(entry, dict) else None
        if isinstance(episode, bool) or not isinstance(episode, int) or episode < 0:
            raise ValueError(
                f'{path} line {number}: "episode_index" is {episode!r}; it must be a whole number '
                ">= 0. Fix the file or download the dataset again"
            )
        ids.append(episode)
    return ids


def _check_episode_files(src: Path, info: dict[str, Any]) -> None:
    """Every episode meta/ lists has its data file, readable, and no data file is unlisted."""
    episodes = _listed_episodes(src)
    chunks_size = info.get("chunks_size", 1000)
    template = info.get("data_path") or "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    try:
        wanted = {src / template.format(episode_chunk=e // chunks_size, episode_index=e): e for e in episodes}
    except (KeyError, IndexError, ValueError):
        raise ValueError(
            f'{src / "meta" / "info.json"}: "data_path" is {template!r}; it must be LeRobot {V21}\'s '
            "template, e.g. 'data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet'. Fix "
            "the file or download the dataset again"
        ) from None
    missing = [p for p in wanted if not p.is_file()]
    extra = sorted(set((src / "data").glob("*/*.parquet")) - set(wanted))
    damaged = [p for p in wanted if p.is_file() and meta.damaged_parquet(p)]
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of its {len(wanted)} episodes have no data file ("
            + ", ".join(str(p.relative_to(src)) for p in missing[:5])
            + (", ..." if len(missing) > 5 else "")
            + ")"
        )
    if damaged:
        problems.append(
            f"{len(damaged)} data file(s) are truncated or damaged ("
            + ", ".join(str(p.relative_to(src)) for p in damaged[:5])
            + ")"
        )
    if extra:
        problems.append(
            f"{len(extra)} data file(s) are not listed in meta/episodes.jsonl ("
            + ", ".join(str(p.relative_to(src)) for p in extra[:5])
            + ")"
        )
    if problems:
        raise ValueError(
            f"{src} cannot be converted: {'; '.join(problems)}. Copy or download the dataset again "
            "(every episode's data file); nothing was written"
        )


def _absent_video_features(src: Path, info: dict[str, Any]) -> list[str]:
    """Video features with no file at all; an error for one with some files but not all."""
    n_episodes = int(info.get("total_episodes", 0))
    dropped = []
    for key, feature in info.get("features", {}).items():
        if feature.get("dtype") != "video":
            continue
        files = list((src / "videos").glob(f"*/{key}/*.mp4"))
        if not files:
            dropped.append(key)
        elif len(files) != n_episodes:
            raise ValueError(
                f"{src / 'videos'} holds {len(files)} videos of {key} for {n_episodes} episodes; copy the missing "
                f"ones (videos/chunk-*/{key}/episode_*.mp4) or remove every video of that camera to drop it"
            )
    return dropped


def _source_view(src: Path, view: Path, info: dict[str, Any], dropped: list[str]) -> Path:
    """A folder LeRobot's converter reads as ``src``: ``data/`` and ``videos/`` linked, ``meta/`` copied without the
    ``dropped`` features (their entries in info.json and episodes_stats.jsonl)."""
    (view / "meta").mkdir(parents=True)
    for name in ("data", "videos"):
        if (src / name).is_dir():
            (view / name).symlink_to((src / name).resolve(), target_is_directory=True)
    for name in LEGACY_META[1:]:
        shutil.copyfile(src / "meta" / name, view / "meta" / name)
    info = dict(info, features={k: v for k, v in info["features"].items() if k not in dropped})
    if dropped and not any(ft.get("dtype") == "video" for ft in info["features"].values()):
        info["video_path"] = None
    write_json(view / "meta" / "info.json", info)
    if dropped:
        lines = []
        for line in (src / "meta" / "episodes_stats.jsonl").read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                entry["stats"] = {k: v for k, v in entry.get("stats", {}).items() if k not in dropped}
                lines.append(json.dumps(entry))
        (view / "meta" / "episodes_stats.jsonl").write_text("\n".join(lines) + "\n")
    return view


def add_cli(sub) -> None:
    """``vla data convert SRC DST`` (added to ``vla data``'s sub-commands)."""
    p = sub.add_parser(
        "convert",
        help="convert a LeRobot v2.1 dataset into a new v3.0 one (LeRobot's converter, offline)",
        description="Convert the LeRobot v2.1 dataset SRC into a new v3.0 dataset DST with LeRobot's own converter, "
        "offline (SRC is left as it is). Cameras listed as video whose files are absent are dropped and named; DST is "
        "written to a hidden sibling folder and renamed into place, so a failed conversion leaves nothing there.",
    )
    p.add_argument("src", type=Path, help="the v2.1 dataset folder (meta/info.json, meta/*.jsonl, data/chunk-*/...)")
    p.add_argument("dst", type=Path, help="the new v3.0 dataset folder (must not exist)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=_run)


def _run(args) -> int:
    convert(args.src, args.dst, overwrite=args.overwrite, log=print)
    return 0
