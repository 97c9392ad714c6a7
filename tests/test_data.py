"""vla.data.reader on datasets recorded in fixtures (tests/conftest.py) and on the real piper_grape dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from vla.data.columns import action_chunks
from vla.data.reader import as_info, dataset_info, split_episodes
from vla.data.stats import frame_stats, load_stats
from vla.data.torch_dataset import ActionChunkDataset, open_dataset

PIPER = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "piper_grape"
T = 10


def raw_column(root: Path, name: str) -> np.ndarray:
    """A column of every data file, in dataset order, straight from parquet: [F, dim]."""
    tables = [pq.read_table(p, columns=[name, "index"]) for p in sorted((root / "data").glob("*/*.parquet"))]
    values = np.concatenate([np.stack(t.column(name).to_numpy(zero_copy_only=False)) for t in tables])
    index = np.concatenate([t.column("index").to_numpy() for t in tables])
    return values[np.argsort(index)]


def edited_copy(src: Path, dst: Path, edit) -> Path:
    """A copy of a dataset with ``edit(info_dict)`` applied to meta/info.json."""
    shutil.copytree(src, dst)
    path = dst / "meta" / "info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))
    return dst


# -- the recording loads back ----------------------------------------------------------------------


def test_recording_loads_back_through_lerobot(tiny_dataset_root):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/push_tiny", root=tiny_dataset_root)
    info = dataset_info(tiny_dataset_root)
    assert ds.num_episodes == info.num_episodes == 4
    assert len(ds) == info.num_frames == int(info.episode_lengths.sum())
    assert ds.fps == info.fps == 80
    assert ds.features["observation.state"]["shape"] == (39,)
    assert ds.features["action"]["shape"] == (4,)
    assert info.state_dim == 39 and info.action_dim == 4 and info.camera_keys == []
    assert ds[0]["task"] == "push the puck to a goal" == info.tasks[0]
    # the recording's own account of itself
    assert info.recording["expert_success_rate"] > 0.5
    assert info.recording["episode_lengths"] == info.episode_lengths.tolist()
    assert info.recording["seeds"] == sorted(set(info.recording["seeds"]))
    assert all(info.recording["episode_success"])
    actions = raw_column(tiny_dataset_root, "action")
    assert np.abs(actions).max() <= 1.0  # recorded as executed: clipped to Meta-World's range


def test_no_partial_folders_left(tiny_dataset_root):
    siblings = [p.name for p in tiny_dataset_root.parent.iterdir()]
    assert siblings == [tiny_dataset_root.name]
    assert not (tiny_dataset_root / "images").exists()


# -- chunks and padding ----------------------------------------------------------------------------


def test_a_read_info_is_passed_on_and_the_dataset_is_a_torch_dataset(tiny_dataset_root):
    import torch

    info = dataset_info(tiny_dataset_root)
    assert as_info(info) is info
    np.testing.assert_array_equal(action_chunks(info, T)[0], action_chunks(tiny_dataset_root, T)[0])
    dataset = ActionChunkDataset(info, T, backend="memory")
    assert isinstance(dataset, torch.utils.data.Dataset) and len(dataset) == info.num_frames  # a chunk per frame
    chunks, _ = action_chunks(info, T)
    np.testing.assert_allclose(np.asarray(dataset[5]["action"]), chunks[5])  # the same chunk, however it is read


def test_chunk_shapes_and_padding_at_episode_ends(tiny_dataset_root):
    ds = ActionChunkDataset(tiny_dataset_root, T)
    info = ds.info
    actions = raw_column(tiny_dataset_root, "action")
    ends = np.cumsum(info.episode_lengths)  # one past each episode's last frame
    for end in ends:
        for left in (1, 3, T, T + 1):  # frames from the episode's end: padded unless left >= T
            sample = ds[int(end - left)]
            assert sample["action"].shape == (T, 4) and sample["action"].dtype.is_floating_point
            assert sample["observation.state"].shape == (39,)
            assert sample["action_is_pad"].shape == (T,)
            expected_pad = np.arange(T) >= left
            np.testing.assert_array_equal(sample["action_is_pad"].numpy(), expected_pad)
            # real steps are the next actions; padded steps repeat the episode's last action
            real = min(left, T)
            np.testing.assert_array_equal(sample["action"][:real].numpy(), actions[end - left : end - left + real])
            last = np.repeat(actions[end - 1 : end], T - real, axis=0)
            np.testing.assert_array_equal(sample["action"][real:].numpy(), last)
    first = ds[0]
    assert not first["action_is_pad"].any()
    assert set(first) == {"observation.state", "task", "action", "action_is_pad"}


def test_fast_path_equals_per_sample_path(tiny_dataset_root):
    for episodes in (None, [1, 3]):
        chunks, is_pad = action_chunks(tiny_dataset_root, T, episodes=episodes)
        ds = ActionChunkDataset(tiny_dataset_root, T, episodes=episodes)
        assert chunks.shape == (len(ds), T, 4) and chunks.dtype == np.float32 and is_pad.dtype == bool
        for i in range(len(ds)):
            sample = ds[i]
            np.testing.assert_array_equal(sample["action"].numpy(), chunks[i])
            np.testing.assert_array_equal(sample["action_is_pad"].numpy(), is_pad[i])


def test_memory_backend_equals_lerobot_backend(tiny_dataset_root):
    slow = ActionChunkDataset(tiny_dataset_root, T, episodes=[0, 2])
    fast = ActionChunkDataset(tiny_dataset_root, T, episodes=[0, 2], backend="memory")
    assert len(slow) == len(fast)
    for i in range(0, len(slow), 7):
        a, b = slow[i], fast[i]
        assert a.keys() == b.keys() and a["task"] == b["task"]
        for key in ("observation.state", "action", "action_is_pad"):
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


def test_stride_takes_every_nth_frame_of_each_episode(tiny_dataset_root):
    every, _ = action_chunks(tiny_dataset_root, T)
    strided, strided_pad = action_chunks(tiny_dataset_root, T, stride=4)
    lengths = dataset_info(tiny_dataset_root).episode_lengths
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = np.concatenate([s + np.arange(0, n, 4) for s, n in zip(starts, lengths)])
    np.testing.assert_array_equal(strided, every[rows])
    assert strided_pad.shape == (len(rows), T)


# -- stats and splits ------------------------------------------------------------------------------


def test_stats_match_numpy_on_the_raw_data(tiny_dataset_root):
    stats = load_stats(tiny_dataset_root)
    lengths = dataset_info(tiny_dataset_root).episode_lengths
    for key in ("action", "observation.state"):
        raw = raw_column(tiny_dataset_root, key).astype(np.float64)  # [F, dim]
        s = stats[key]
        np.testing.assert_allclose(s["mean"], raw.mean(0), rtol=1e-5, atol=1e-6)
        # LeRobot works in float32: a dimension with a tiny spread around a value near 1 (a quaternion
        # component) loses ~1e-5 of its std to cancellation
        np.testing.assert_allclose(s["std"], raw.std(0), rtol=1e-4, atol=5e-5)
        np.testing.assert_allclose(s["min"], raw.min(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(s["max"], raw.max(0), rtol=1e-6, atol=1e-7)
        # LeRobot's quantiles: frame-weighted mean of per-episode (histogram) quantiles
        per_episode = np.split(raw, np.cumsum(lengths)[:-1])
        spread = raw.max(0) - raw.min(0)
        for name, q in (("q01", 0.01), ("q99", 0.99)):
            expected = sum(len(e) * np.quantile(e, q, axis=0) for e in per_episode) / len(raw)
            np.testing.assert_allclose(s[name], expected, atol=0.02 * spread.max() + 1e-6)
            assert np.all(s[name] >= raw.min(0) - 1e-6) and np.all(s[name] <= raw.max(0) + 1e-6)


def test_frame_stats_are_the_exact_quantiles_that_stats_json_lacks(tiny_dataset_root):
    lengths = dataset_info(tiny_dataset_root).episode_lengths
    raw = raw_column(tiny_dataset_root, "observation.state").astype(np.float64)
    stats = frame_stats(tiny_dataset_root, ["observation.state", "action"])
    s = stats["observation.state"]
    for name, value in (
        ("q01", np.quantile(raw, 0.01, 0)),
        ("q99", np.quantile(raw, 0.99, 0)),
        ("mean", raw.mean(0)),
        ("std", raw.std(0)),
        ("min", raw.min(0)),
        ("max", raw.max(0)),
    ):
        np.testing.assert_allclose(s[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert s["count"][0] == len(raw) and stats["action"]["q01"].shape == (4,)
    # The goal (the last 3 state dims) is constant within an episode and differs between them: stats.json's
    # averaged per-episode quantiles collapse its x range to a point; the frames give the real one.
    goal_x = slice(36, 37)
    assert (s["q99"] - s["q01"])[goal_x] > 0.01
    lerobot = load_stats(tiny_dataset_root)["observation.state"]
    assert (lerobot["q99"] - lerobot["q01"])[goal_x] < 0.5 * (s["q99"] - s["q01"])[goal_x]
    # a subset of episodes: only their frames
    first = raw[: lengths[0]]
    only_first = frame_stats(tiny_dataset_root, ["observation.state"], episodes=[0])["observation.state"]
    np.testing.assert_allclose(only_first["q99"], np.quantile(first, 0.99, 0), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="no feature 'observation.stat'"):
        frame_stats(tiny_dataset_root, ["observation.stat"])


def test_split_by_episode_is_seeded_and_disjoint(tiny_dataset_root):
    train, held = split_episodes(tiny_dataset_root, heldout=0.25, seed=0)
    assert len(held) == 1 and len(train) == 3
    assert sorted(train + held) == [0, 1, 2, 3]
    assert split_episodes(tiny_dataset_root, heldout=0.25, seed=0) == (train, held)
    assert {tuple(split_episodes(tiny_dataset_root, heldout=0.25, seed=s)[1]) for s in range(10)} != {tuple(held)}
    assert split_episodes(tiny_dataset_root, heldout=0.0) == ([0, 1, 2, 3], [])
    with pytest.raises(ValueError, match="fraction"):
        split_episodes(tiny_dataset_root, heldout=1.0)


# -- images ----------------------------------------------------------------------------------------


def test_image_samples_and_state_only_reading(tiny_image_dataset_root):
    from vla.sim import make_env

    info = dataset_info(tiny_image_dataset_root)
    assert info.camera_keys == ["observation.images.corner2"]
    ds = ActionChunkDataset(tiny_image_dataset_root, T)
    sample = ds[0]
    image = sample["observation.images.corner2"]
    assert image.shape == (3, 64, 64) and image.dtype.is_floating_point
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.01
    # PNG frames are lossless: the stored first frame is what the simulator renders on that seed
    with make_env("metaworld/push-v3", image_keys=info.camera_keys, image_size=64) as env:
        obs = env.reset(info.recording["seeds"][0])
    np.testing.assert_array_equal(image.numpy(), obs["observation.images.corner2"])

    state_only = ActionChunkDataset(tiny_image_dataset_root, T, image_keys=[])
    plain = state_only[0]
    assert "observation.images.corner2" not in plain
    np.testing.assert_array_equal(plain["action"].numpy(), sample["action"].numpy())
    chunks, _ = action_chunks(tiny_image_dataset_root, T)
    np.testing.assert_array_equal(chunks[len(ds) - 1], ds[len(ds) - 1]["action"].numpy())
    with pytest.raises(ValueError, match="corner2"):
        ActionChunkDataset(tiny_image_dataset_root, T, image_keys=["observation.images.corner"])
    memory = ActionChunkDataset(tiny_image_dataset_root, T, backend="memory", progress=False)[0]
    assert torch.equal(memory["observation.images.corner2"], sample["observation.images.corner2"])


# -- bad input -------------------------------------------------------------------------------------


def test_missing_root_or_not_a_dataset(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        action_chunks(tmp_path / "nope", T)
    assert not (tmp_path / "nope").exists()  # nothing created on the way (LeRobot would mkdir it)
    with pytest.raises(ValueError, match="does not exist"):
        open_dataset(tmp_path / "nope", T)
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ValueError, match="not a LeRobot dataset"):
        dataset_info(tmp_path)


def test_dataset_without_action(tiny_dataset_root, tmp_path):
    def rename(info):
        info["features"]["act"] = info["features"].pop("action")

    root = edited_copy(tiny_dataset_root, tmp_path / "ds", rename)
    for call in (lambda: action_chunks(root, T), lambda: dataset_info(root), lambda: open_dataset(root, T)):
        with pytest.raises(ValueError, match="no 'action' feature"):
            call()


def test_non_numeric_feature(tiny_dataset_root, tmp_path):
    def stringify(info):
        info["features"]["action"]["dtype"] = "string"

    root = edited_copy(tiny_dataset_root, tmp_path / "ds", stringify)
    with pytest.raises(ValueError, match="must be numeric"):
        action_chunks(root, T)


def test_wrong_version(tiny_dataset_root, tmp_path):
    root = edited_copy(tiny_dataset_root, tmp_path / "ds", lambda info: info.update(codebase_version="v2.1"))
    with pytest.raises(ValueError, match="v2.1"):
        dataset_info(root)


def test_chunk_longer_than_every_episode(tiny_dataset_root):
    lengths = dataset_info(tiny_dataset_root).episode_lengths
    longest, shortest = int(lengths.max()), int(np.argmin(lengths))
    action_chunks(tiny_dataset_root, longest)  # as long as the longest episode: fine
    for call in (action_chunks, open_dataset, ActionChunkDataset):
        with pytest.raises(ValueError, match="longer than every episode"):
            call(tiny_dataset_root, longest + 1)
    # a split of short episodes only (one seed's held-out episodes) keeps the dataset's chunk, padded
    assert lengths[shortest] < longest
    chunks, is_pad = action_chunks(tiny_dataset_root, longest, episodes=[shortest])
    assert chunks.shape == (lengths[shortest], longest, chunks.shape[2]) and is_pad[0, lengths[shortest] :].all()
    assert len(ActionChunkDataset(tiny_dataset_root, longest, episodes=[shortest])) == lengths[shortest]
    with pytest.raises(ValueError, match="positive integer"):
        action_chunks(tiny_dataset_root, 0)


def test_unknown_episodes_and_bad_stride(tiny_dataset_root):
    with pytest.raises(ValueError, match=r"episodes \[7\]"):
        action_chunks(tiny_dataset_root, T, episodes=[0, 7])
    with pytest.raises(ValueError, match="stride"):
        action_chunks(tiny_dataset_root, T, stride=0)


def test_missing_stats(tiny_dataset_root, tmp_path):
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    (root / "meta" / "stats.json").unlink()
    with pytest.raises(ValueError, match="stats.json is missing"):
        load_stats(root)


# -- the real dataset ------------------------------------------------------------------------------


@pytest.mark.skipif(not PIPER.is_dir(), reason="needs ../shared/data/real/piper_grape")
def test_piper_grape_chunks_match_lerobot_at_episode_ends():
    info = dataset_info(PIPER)
    assert (info.num_episodes, info.num_frames, info.fps, info.action_dim) == (55, 13331, 15, 6)
    chunks, is_pad = action_chunks(PIPER, 15)
    assert chunks.shape == (13331, 15, 6) and is_pad.shape == (13331, 15)
    # every episode's last 14 frames are padded, progressively
    assert is_pad.sum() == 55 * sum(range(15))
    ds = ActionChunkDataset(PIPER, 15)
    ends = np.cumsum(info.episode_lengths)
    for i in [0, 1, *(ends - 1), *(ends - 7)][:40]:
        sample = ds[int(i)]
        np.testing.assert_array_equal(sample["action"].numpy(), chunks[i])
        np.testing.assert_array_equal(sample["action_is_pad"].numpy(), is_pad[i])
    stats = load_stats(PIPER)
    raw = chunks[:, 0].astype(np.float64)  # each frame's own action
    np.testing.assert_allclose(stats["action"]["mean"], raw.mean(0), rtol=1e-4)


# -- a dataset with a video camera (how most LeRobot datasets store images) ------------------------


@pytest.fixture(scope="module")
def tiny_video_dataset_root(tmp_path_factory) -> Path:
    """2 episodes of 12 frames: a 32 px video camera whose frame k is a flat grey of value 16 k."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("video") / "ds"
    features = {
        "observation.images.cam": {"dtype": "video", "shape": (32, 32, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    ds = LeRobotDataset.create("local/video", fps=10, features=features, root=root, use_videos=True)
    for episode in range(2):
        for k in range(12):
            value = np.array([episode, k], np.float32)
            grey = np.full((32, 32, 3), 16 * k, np.uint8)
            ds.add_frame({"observation.images.cam": grey, "observation.state": value, "action": value, "task": "t"})
        ds.save_episode()
    ds.finalize()
    return root


def test_video_camera_decodes_or_is_skipped(tiny_video_dataset_root, tmp_path, monkeypatch):
    ds = ActionChunkDataset(tiny_video_dataset_root, 4)
    sample = ds[5]
    image = sample["observation.images.cam"]
    assert image.shape == (3, 32, 32) and image.dtype.is_floating_point
    assert abs(float(image.mean()) * 255 - 16 * 5) < 6  # lossy codec: close to the flat grey it encoded
    np.testing.assert_array_equal(sample["action"].numpy(), [[0, 5], [0, 6], [0, 7], [0, 8]])

    # image_keys=[]: the camera is never decoded
    import lerobot.datasets.dataset_reader as reader

    def no_decoding(*args, **kwargs):
        raise AssertionError("a video was decoded")

    monkeypatch.setattr(reader, "decode_video_frames", no_decoding)
    plain = ActionChunkDataset(tiny_video_dataset_root, 4, image_keys=[])[5]
    assert "observation.images.cam" not in plain
    np.testing.assert_array_equal(plain["action"].numpy(), sample["action"].numpy())

    # without its video files, LeRobot cannot open it: a clear error, and the fast paths still work
    copy = shutil.copytree(tiny_video_dataset_root, tmp_path / "no_videos")
    shutil.rmtree(copy / "videos")
    with pytest.raises(ValueError, match="lacks the video file"):
        ActionChunkDataset(copy, 4, image_keys=[])
    memory = ActionChunkDataset(copy, 4, image_keys=[], backend="memory")[5]
    np.testing.assert_array_equal(memory["action"].numpy(), sample["action"].numpy())
    assert action_chunks(copy, 4)[0].shape == (24, 4, 2)


def test_data_stats_writes_exact_quantiles_that_lerobot_then_reads(tiny_dataset_root, tmp_path, capsys):
    """`vla data stats`: LeRobot's averaged per-episode quantiles replaced by the frames' own, original kept."""
    from vla.cli import main

    root = tmp_path / "ds"
    shutil.copytree(tiny_dataset_root, root)
    before = (root / "meta" / "stats.json").read_text()
    assert main(["data", "stats", str(root)]) == 0 and "stats.json.orig" in capsys.readouterr().out
    assert (root / "meta" / "stats.json.orig").read_text() == before
    written = load_stats(root)
    exact = frame_stats(root, ["action", "observation.state"])
    for key in ("action", "observation.state"):
        for q in ("q01", "q10", "q50", "q90", "q99", "min", "max"):
            np.testing.assert_allclose(written[key][q], exact[key][q])
    goal = slice(36, 38)  # goal x, y: constant within an episode, collapsed in LeRobot's stats, real in the exact ones
    assert (written["observation.state"]["q99"][goal] - written["observation.state"]["q01"][goal] > 1e-6).all()
    assert set(json.loads(before)) == set(json.loads((root / "meta" / "stats.json").read_text()))  # other keys kept
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata("local/ds", root=root)
    np.testing.assert_allclose(np.asarray(meta.stats["action"]["q99"]), exact["action"]["q99"])
