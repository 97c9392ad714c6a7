"""Cameras as LeRobot records them: `vla data record --images` writes video features (LeRobot's writer and default
encoder), `--image-format png` exact frames; both read back through LeRobot or decoded once into memory, identically;
a dataset missing a video file is a clear error that writes nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vla.cli import main
from vla.compare import load_split
from vla.data.columns import action_chunks
from vla.data.reader import dataset_info
from vla.data.torch_dataset import MEMORY_BUDGET, ActionChunkDataset, choose_backend, frame_bytes, open_dataset
from vla.data.videos import check_videos, video_index
from vla.io import read_json

CAM = "observation.images.corner2"
T, SIZE, STEPS = 5, 64, 20  # 2 episodes cut at 20 steps (kept although unfinished): 40 frames each way

os.environ.setdefault("SVT_LOG", "1")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Path]:
    """The same 2 episodes recorded twice through the CLI (recording is deterministic per seed): the default
    (video) and ``--image-format png``."""
    roots = {}
    for fmt, extra in (("video", []), ("png", ["--image-format", "png"])):
        roots[fmt] = tmp_path_factory.mktemp("video") / fmt
        args = [
            "data",
            "record",
            "--images",
            "--image-size",
            str(SIZE),
            "--camera",
            CAM,
            "--episodes",
            "2",
            "--max-steps",
            str(STEPS),
            "--keep-failed",
            "--quiet",
            "--root",
            str(roots[fmt]),
            *extra,
        ]
        assert main(args) == 0
    return roots


def test_record_stores_video_by_default_and_png_on_request(recorded):
    video, png = dataset_info(recorded["video"]), dataset_info(recorded["png"])
    assert video.features[CAM]["dtype"] == "video" and png.features[CAM]["dtype"] == "image"
    assert video.features[CAM]["info"]["video.codec"] == "av1"  # LeRobot's default encoder (libsvtav1)
    assert video.camera_text(CAM) == f"{CAM} 64x64 video (av1)" and png.camera_text(CAM) == f"{CAM} 64x64 png"
    assert video.recording["image_format"] == "video" and png.recording["image_format"] == "png"
    assert [p.name for p in video_index(video, CAM)["path"]] == ["file-000.mp4"] * 2
    assert not (recorded["video"] / "images").exists()  # LeRobot's staging frames are gone once encoded
    # vla compare reads actions only: the same chunks from both
    np.testing.assert_array_equal(action_chunks(video, T)[0], action_chunks(png, T)[0])
    np.testing.assert_array_equal(
        load_split(recorded["video"], T, 0.5, 0).train, load_split(recorded["png"], T, 0.5, 0).train
    )


def test_decoded_video_matches_the_png_frames_within_the_codec_tolerance(recorded):
    """LeRobot's default encoder (AV1, yuv420p, CRF 30) on 64 px Meta-World frames: measured mean abs error 4.1 grey
    levels (of 255; luma 2.1, the rest is chroma subsampling at colour edges), every frame's under 4.5, 99% of pixel
    values within 32, PSNR 29.8 dB. Bounds: mean <= 6, each frame <= 7, 99th percentile <= 48, PSNR >= 26 dB."""
    video = ActionChunkDataset(recorded["video"], T, backend="memory", progress=False)
    png = ActionChunkDataset(recorded["png"], T, backend="memory", progress=False)
    assert len(video) == len(png) == 2 * STEPS
    v = torch.stack([video[i][CAM] for i in range(len(video))]) * 255  # [N, 3, 64, 64]
    p = torch.stack([png[i][CAM] for i in range(len(png))]) * 255
    error = (v - p).abs()
    assert error.mean() <= 6 and error.mean(dim=(1, 2, 3)).max() <= 7
    assert torch.quantile(error.flatten(), 0.99) <= 48
    assert 10 * torch.log10(255**2 / ((v - p) ** 2).mean()) >= 26
    assert error.mean() > 0.1  # lossy indeed: the PNG frames are not what the video holds
    for i in (0, 17, 39):  # state and actions are the same numbers
        torch.testing.assert_close(video[i]["observation.state"], png[i]["observation.state"], rtol=0, atol=0)
        torch.testing.assert_close(video[i]["action"], png[i]["action"], rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["png", "video"])
def test_memory_backend_serves_the_lerobot_backends_samples(recorded, fmt):
    """Same keys, shapes, dtypes and values: exact at the stored size (PNG and video: the same decoder), within half a
    grey level resized (the memory backend resizes once and stores uint8)."""
    root = recorded[fmt]
    for size, tolerance in ((None, 0.0), (32, 0.5 / 255 + 1e-6)):
        memory = ActionChunkDataset(root, T, image_size=size, backend="memory", progress=False)
        lerobot = ActionChunkDataset(root, T, image_size=size, backend="lerobot")
        assert len(memory) == len(lerobot)
        assert memory._images[CAM].dtype == torch.uint8 and memory._images[CAM].shape == (
            2 * STEPS,
            3,
            size or 64,
            size or 64,
        )
        for i in (0, 1, STEPS - 1, STEPS, 2 * STEPS - 1):
            m, r = memory[i], lerobot[i]
            assert m.keys() == r.keys()
            for key in m:
                if key == "task":
                    assert m[key] == r[key]
                    continue
                assert m[key].shape == r[key].shape and m[key].dtype == r[key].dtype, key
                assert (m[key].float() - r[key].float()).abs().max() <= (tolerance if key == CAM else 0), (key, size)


def test_auto_backend_takes_memory_when_the_frames_fit(recorded):
    root = recorded["video"]
    assert frame_bytes(root, [CAM], 32) == 2 * STEPS * 32 * 32 * 3
    assert (
        choose_backend(root, [CAM], 32)[0] == "memory" and choose_backend(root, [CAM], 32, budget=1000)[0] == "lerobot"
    )
    assert "MiB" in choose_backend(root, [CAM], 32, budget=1000)[1] and MEMORY_BUDGET == 2 * 1024**3
    assert choose_backend(root, [])[0] == "memory"
    assert ActionChunkDataset(root, T, image_size=32, backend="auto", progress=False).backend == "memory"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_missing_video_file_is_a_clear_error_and_nothing_is_written(recorded, tmp_path, capsys):
    root = shutil.copytree(recorded["video"], tmp_path / "ds")
    (root / "videos" / CAM / "chunk-000" / "file-000.mp4").unlink()
    before, beside = _tree(tmp_path), sorted(os.listdir(tmp_path))
    wanted = rf"lacks the video file videos/{CAM}/chunk-000/file-000.mp4 of camera {CAM} \(episodes 0-1.*Copy the dataset's videos/"
    with pytest.raises(ValueError, match=wanted):
        check_videos(root)
    with pytest.raises(ValueError, match=wanted):
        open_dataset(root, T)
    for backend in ("lerobot", "memory", "auto"):
        with pytest.raises(ValueError, match=wanted):
            ActionChunkDataset(root, T, backend=backend, progress=False)
    with pytest.raises(ValueError, match=wanted):  # LeRobot opens a dataset only with all its videos
        ActionChunkDataset(root, T, image_keys=[], backend="lerobot")
    assert main(["data", "info", str(root)]) == 1
    out, err = capsys.readouterr()
    assert f"{CAM} 64x64 video (av1)" in out and "file-000.mp4" in err and err.count("\n") == 1
    # without the camera, the memory backend still reads actions and state
    plain = ActionChunkDataset(root, T, image_keys=[], backend="memory")[3]
    np.testing.assert_array_equal(plain["action"].numpy(), action_chunks(root, T)[0][3])
    assert _tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == beside  # nothing written, nothing half-made
    assert read_json(root / "meta" / "info.json", "dataset info")["features"][CAM]["dtype"] == "video"
