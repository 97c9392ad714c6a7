"""A dataset's cameras stored as video: which they are, where each episode's frames live, whether every file is there.

video_keys(info)                 # the cameras stored as MP4 (the rest are PNG frames in the parquet rows)
video_index(info, key)           # per episode: the MP4 path and the first frame's timestamp in it
check_videos(info, keys, eps)    # a ValueError naming the first missing file, before anything is decoded
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vla.data.reader import DatasetInfo, _check_episodes, as_info, episode_ranges


def video_index(root: str | Path | DatasetInfo, key: str) -> dict[str, np.ndarray]:
    """Where camera ``key``'s frames of each episode live, from the episode table: ``episode_index`` int64 [E],
    ``path`` [E] (the MP4 file, under the dataset's folder) and ``from_timestamp`` float64 [E] (the episode's first
    frame's time in that file), in episode order. ``key`` must be a video feature."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = as_info(root)
    if info.features.get(key, {}).get("dtype") != "video":
        videos = ", ".join(video_keys(info)) or "none"
        raise ValueError(f"{key!r} is not a video feature of {info.root} (its videos: {videos})")
    columns = [f"videos/{key}/{name}" for name in ("chunk_index", "file_index", "from_timestamp")]
    files = sorted((info.root / "meta" / "episodes").glob("*/*.parquet"))
    try:
        table = pa.concat_tables(pq.read_table(f, columns=["episode_index", *columns]) for f in files)
    except (KeyError, pa.ArrowInvalid) as err:
        raise ValueError(
            f"{info.root}'s episode table has no video columns for {key} ({err}); the dataset's meta/ "
            "is incomplete: copy or record it again"
        ) from None
    order = np.argsort(table.column("episode_index").to_numpy())
    chunk, file, start = (table.column(c).to_numpy()[order] for c in columns)
    template = info.video_path or "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    paths = [
        info.root / template.format(video_key=key, chunk_index=int(c), file_index=int(f)) for c, f in zip(chunk, file)
    ]
    return {
        "episode_index": table.column("episode_index").to_numpy()[order].astype(np.int64),
        "path": np.array(paths, dtype=object),
        "from_timestamp": start.astype(np.float64),
    }


def video_keys(root: str | Path | DatasetInfo) -> list[str]:
    """The cameras stored as video (the rest of ``camera_keys`` are PNG frames in the parquet rows)."""
    info = as_info(root)
    return [k for k in info.camera_keys if info.features[k]["dtype"] == "video"]


def check_videos(
    root: str | Path | DatasetInfo, keys: list[str] | None = None, episodes: list[int] | None = None
) -> None:
    """A ``ValueError`` naming the first missing video file (and how many are missing) among the cameras ``keys``
    (None: every video camera) of ``episodes`` (None: all); nothing when every file is there. Reads ``meta/`` only."""
    info = as_info(root)
    chosen = set(_check_episodes(info, episodes))
    for key in [k for k in (info.camera_keys if keys is None else keys) if k in video_keys(info)]:
        index = video_index(info, key)
        wanted = dict.fromkeys(p for e, p in zip(index["episode_index"], index["path"]) if int(e) in chosen)
        missing = [p for p in wanted if not p.is_file()]
        if missing:
            episodes_in = [int(e) for e, p in zip(index["episode_index"], index["path"]) if p == missing[0]]
            raise ValueError(
                f"{info.root} lacks the video file {missing[0].relative_to(info.root)} of camera {key} (episodes "
                f"{episode_ranges(episodes_in)}; {len(missing)} of its {len(wanted)} files are missing). Copy the dataset's "
                "videos/ folder again (or record it again); to train without this camera, leave it out of image_keys "
                "(without any camera: image_keys=[] and backend='memory' read actions and state only)"
            )
