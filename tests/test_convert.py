"""``vla data convert``: a LeRobot v2.1 dataset written here (meta/*.jsonl, one parquet per episode) becomes a v3.0
dataset that vla and LeRobot read with the same frames; a camera listed as video with no files is dropped (LeRobot's
own converter fails on it); a failed conversion leaves nothing at the destination."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vla.cli import main
from vla.data.convert import convert

FPS, LENGTHS = 10, (12, 9)
CAM = "observation.images.top"


def write_v21(root: Path, *, video_camera: bool = False) -> dict[int, pd.DataFrame]:
    """A two-episode v2.1 dataset (3-D state, 2-D action, two tasks); ``video_camera`` lists a video feature whose
    files are absent. Returns each episode's frames."""
    rng = np.random.default_rng(0)
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["dx", "dy"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    if video_camera:
        features[CAM] = {
            "dtype": "video",
            "shape": [48, 64, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.fps": FPS, "video.codec": "av1"},
        }
    (root / "meta").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    frames, start, episodes, stats = {}, 0, [], []
    for ep, n in enumerate(LENGTHS):
        state = rng.standard_normal((n, 3)).astype(np.float32)
        action = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        df = pd.DataFrame(
            {
                "observation.state": list(state),
                "action": list(action),
                "timestamp": np.arange(n, dtype=np.float32) / FPS,
                "frame_index": np.arange(n),
                "episode_index": np.full(n, ep),
                "index": np.arange(start, start + n),
                "task_index": np.full(n, ep),
            }
        )
        df.to_parquet(root / "data" / "chunk-000" / f"episode_{ep:06d}.parquet", index=False)
        frames[ep], start = df, start + n
        episodes.append({"episode_index": ep, "tasks": [f"task {ep}"], "length": n})
        entry = {
            k: _stats(np.stack(df[k].to_numpy()) if k in ("observation.state", "action") else df[k].to_numpy()[:, None])
            for k in df.columns
        }
        if video_camera:
            entry[CAM] = {s: np.full((3, 1, 1), 0.5).tolist() for s in ("min", "max", "mean", "std")} | {"count": [n]}
        stats.append({"episode_index": ep, "stats": entry})
    info = {
        "codebase_version": "v2.1",
        "robot_type": "test",
        "total_episodes": len(LENGTHS),
        "total_frames": start,
        "total_tasks": len(LENGTHS),
        "total_videos": len(LENGTHS) if video_camera else 0,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(LENGTHS)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        if video_camera
        else None,
        "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    _jsonl(root / "meta" / "episodes.jsonl", episodes)
    _jsonl(root / "meta" / "tasks.jsonl", [{"task_index": i, "task": f"task {i}"} for i in range(len(LENGTHS))])
    _jsonl(root / "meta" / "episodes_stats.jsonl", stats)
    return frames


def _stats(x: np.ndarray) -> dict:
    x = x.astype(np.float64)
    return {
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "count": [len(x)],
    }


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_v21_dataset_converts_to_v30_with_the_same_frames(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from vla.data import reader

    frames = write_v21(tmp_path / "old")
    before = sorted(p.relative_to(tmp_path / "old") for p in (tmp_path / "old").rglob("*"))
    assert main(["data", "convert", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    assert sorted(p.relative_to(tmp_path / "old") for p in (tmp_path / "old").rglob("*")) == before  # SRC untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left
    info = reader.dataset_info(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "meta" / "info.json").read_text())["codebase_version"] == "v3.0"
    assert info.episode_lengths.tolist() == list(LENGTHS) and info.tasks == ["task 0", "task 1"]
    assert info.state_dim == 3 and info.action_dim == 2
    ds = LeRobotDataset("local/new", root=tmp_path / "new")
    assert len(ds) == sum(LENGTHS)
    sample = ds[LENGTHS[0] + 4]  # episode 1, frame 4
    assert np.allclose(sample["observation.state"].numpy(), frames[1]["observation.state"][4])
    assert np.allclose(sample["action"].numpy(), frames[1]["action"][4]) and sample["task"] == "task 1"


def test_a_camera_whose_videos_are_absent_is_dropped_and_named(tmp_path):
    write_v21(tmp_path / "old", video_camera=True)
    said = []
    summary = convert(tmp_path / "old", tmp_path / "new", log=said.append)
    assert summary["dropped"] == [CAM] and CAM not in summary["features"]
    assert any(CAM in line and "absent" in line for line in said)
    info = json.loads((tmp_path / "new" / "meta" / "info.json").read_text())
    assert CAM not in info["features"] and "observation.state" in info["features"]
    assert CAM not in json.loads((tmp_path / "new" / "meta" / "stats.json").read_text())


def test_bad_sources_and_failed_conversions_leave_no_destination(tmp_path, monkeypatch):
    write_v21(tmp_path / "old")
    with pytest.raises(ValueError, match="already exists"):
        (tmp_path / "taken").mkdir()
        convert(tmp_path / "old", tmp_path / "taken")
    with pytest.raises(ValueError, match="not a LeRobot dataset"):
        convert(tmp_path / "nothing", tmp_path / "x")
    (tmp_path / "old" / "meta" / "episodes_stats.jsonl").rename(tmp_path / "stats.jsonl")
    with pytest.raises(ValueError, match="episodes_stats.jsonl"):
        convert(tmp_path / "old", tmp_path / "x")
    (tmp_path / "stats.jsonl").rename(tmp_path / "old" / "meta" / "episodes_stats.jsonl")

    from lerobot.scripts import convert_dataset_v21_to_v30 as lerobot_convert

    def broken(*_):
        raise OSError("disk full")

    monkeypatch.setattr(lerobot_convert, "convert_episodes_metadata", broken)  # fails after the data is written
    with pytest.raises(OSError, match="disk full"):
        convert(tmp_path / "old", tmp_path / "x")
    assert not (tmp_path / "x").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".x")]
    assert main(["data", "convert", str(tmp_path / "x"), str(tmp_path / "y")]) == 1  # one line, no traceback


def test_an_episode_without_its_data_file_is_named_before_anything_is_written(tmp_path, capsys):
    """LeRobot's converter numbers the data files it finds and failed late with "Number of episodes is not the same
    ({1, 2})"; the pre-flight names the missing file."""
    write_v21(tmp_path / "old")
    (tmp_path / "old" / "data" / "chunk-000" / "episode_000001.parquet").unlink()
    assert main(["data", "convert", str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vla data: error: ")
    assert "1 of its 2 episodes have no data file (data/chunk-000/episode_000001.parquet)" in err[0]
    assert "Copy or download the dataset again" in err[0] and "nothing was written" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no destination, no staging folder


def test_a_destination_inside_or_around_the_source_is_refused(tmp_path, capsys):
    """`vla data convert SRC SRC/out` wrote into the source dataset's folder."""
    write_v21(tmp_path / "old")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for dst, said in (
        (tmp_path / "old" / "out", "is inside the source dataset"),
        (tmp_path / "old", "is the source"),
        (tmp_path, "holds the source dataset"),
    ):
        assert main(["data", "convert", str(tmp_path / "old"), str(dst), "--overwrite"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "convert into a" in err[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written, nothing lost


def test_names_in_a_nested_layout_are_written_flat(tmp_path):
    """v2.x datasets often hold a list holding one list, or {"motors": [...]}; the converted info.json is flat."""
    write_v21(tmp_path / "old")
    path = tmp_path / "old" / "meta" / "info.json"
    info = json.loads(path.read_text())
    info["features"]["observation.state"]["names"] = [["x", "y", "z"]]
    info["features"]["action"]["names"] = {"motors": ["dx", "dy"]}
    path.write_text(json.dumps(info))
    convert(tmp_path / "old", tmp_path / "new", log=lambda *_: None)
    features = json.loads((tmp_path / "new" / "meta" / "info.json").read_text())["features"]
    assert features["observation.state"]["names"] == ["x", "y", "z"] and features["action"]["names"] == ["dx", "dy"]
