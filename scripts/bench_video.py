#!/usr/bin/env python
"""Training samples from cameras: samples/s and construction time of ``ActionChunkDataset``, LeRobot backend against
memory backend, on the same frames stored as PNG and as video.

    python scripts/bench_video.py --png outputs/datasets/push64_png --out results/bench_video.json [--work DIR] [--seconds 20]

``--png`` is a dataset recorded with ``vla data record --images --image-format png`` (read only: it is copied into
``--work``). Its video twin is written there by LeRobot's own writer and default encoder from the same decoded
frames, states and actions (``transcode``). For each storage and backend the script times the construction, then
``dataset[i]`` over random indices (``dataset``: what a DataLoader worker does per sample), then whole batches of 32
through the ``Collate`` of a ``tiny`` FAST policy with the camera (``loader``: indexing, collating, stacking,
shifting, tokenising and packing; no model step), single process, one thread. The machine's load is recorded beside
the numbers (a shared machine: compare rows of one run, not runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SVT_LOG", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

BATCH = 32


def transcode(src: Path, dst: Path) -> float:
    """A copy of ``src`` with every camera as a LeRobot video feature (its writer, its default encoder); seconds."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.constants import ACTION, OBS_STATE

    from vla.data.reader import dataset_info
    from vla.data.torch_dataset import ActionChunkDataset
    from vla.sim.record import stored_features

    started = time.perf_counter()
    info = dataset_info(src)
    frames = ActionChunkDataset(info, 1, backend="memory", progress=False)  # every PNG decoded once
    keep = {k: ft for k, ft in info.features.items() if k in (OBS_STATE, ACTION, *info.camera_keys)}
    out = LeRobotDataset.create(
        f"local/{dst.name}",
        fps=info.fps,
        features=stored_features(keep, True),
        root=dst,
        robot_type=info.robot_type,
        use_videos=True,
        video_backend="pyav",
    )
    episode = frames._frames["episode_index"]
    for i in range(len(frames)):
        sample = frames[i]
        frame = {ACTION: sample[ACTION][0].numpy(), "task": sample["task"]}
        if OBS_STATE in sample:
            frame[OBS_STATE] = sample[OBS_STATE].numpy()
        for key in info.camera_keys:
            frame[key] = frames._images[key][i].permute(1, 2, 0).numpy()  # uint8 [H, W, 3]
        out.add_frame(frame)
        if i + 1 == len(frames) or episode[i + 1] != episode[i]:
            out.save_episode()
    out.finalize()
    return time.perf_counter() - started


def rate(fn, indices: list, seconds: float) -> tuple[float, int]:
    """Calls per second of ``fn(i)`` over ``indices`` (cycled) for about ``seconds``."""
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn(indices[done % len(indices)])
        done += 1
    return done / (time.perf_counter() - started), done


def tiny_policy(root: Path, camera: str, size: int):
    import action_tokenizers as at

    from vla.data.columns import action_chunks, chunk_states
    from vla.data.reader import dataset_info
    from vla.policy import VLAConfig, VLAPolicy

    info = dataset_info(root)
    chunks, _ = action_chunks(info, 10)
    action_norm = at.Normalizer.fit(chunks.reshape(-1, info.action_dim))
    tokenizer = at.FASTTokenizer.fit(action_norm.normalize(chunks[::4]), vocab_size=256)
    config = VLAConfig(preset="tiny", image_keys=[camera], image_size=size, device="cpu", init_seed=0)
    return VLAPolicy(
        config,
        action_tokenizer=tokenizer,
        action_normalizer=action_norm,
        state_normalizer=at.Normalizer.fit(chunk_states(info)),
    )


def measure(root: Path, backend: str, camera: str, size: int, seconds: float, policy) -> dict:
    from vla.data.torch_dataset import ActionChunkDataset
    from vla.policy.pipeline import Collate

    started = time.perf_counter()
    ds = ActionChunkDataset(root, 10, image_keys=[camera], image_size=size, backend=backend, progress=False)
    built = time.perf_counter() - started
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds)).tolist()
    per_sample, n = rate(lambda i: ds[i], order, seconds)
    collate = Collate(policy.pipeline.training)
    batches = [order[k : k + BATCH] for k in range(0, len(order) - BATCH, BATCH)]
    per_batch, m = rate(lambda idx: collate([ds[i] for i in idx]), batches, seconds)
    return {
        "backend": backend,
        "construct_s": round(built, 3),
        "dataset_samples_per_s": round(per_sample, 1),
        "dataset_ms_per_sample": round(1000 / per_sample, 3),
        "loader_samples_per_s": round(per_batch * BATCH, 1),
        "loader_ms_per_batch": round(1000 / per_batch, 1),
        "samples_timed": n,
        "batches_timed": m,
    }


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, required=True, help="a dataset with PNG cameras (read only)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_video.json"))
    parser.add_argument("--allow-loaded", action="store_true", help="write to --out even when the machine was loaded")
    parser.add_argument("--work", type=Path, default=Path("outputs/bench_video"), help="where the copies go")
    parser.add_argument("--seconds", type=float, default=20.0, help="timing per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loads = [os.getloadavg()[0]]

    from vla.data.reader import dataset_info

    args.work.mkdir(parents=True, exist_ok=True)
    png, video = args.work / "png", args.work / "video"
    if not png.exists():
        shutil.copytree(args.png, png)
    transcode_s = None
    if not video.exists():
        transcode_s = transcode(png, video)
    info = dataset_info(png)
    camera = info.camera_keys[0]
    size = info.camera_shape(camera)[0]
    policy = tiny_policy(png, camera, size)
    rows = []
    for storage, root in (("png", png), ("video", video)):
        for backend in ("lerobot", "memory"):
            row = {"storage": storage, **measure(root, backend, camera, size, args.seconds, policy)}
            print(json.dumps(row))
            rows.append(row)
    video_info = dataset_info(video).features[camera].get("info", {})
    meta = {
        "dataset": str(args.png),
        "episodes": info.num_episodes,
        "frames": info.num_frames,
        "camera": camera,
        "camera_size": list(info.camera_shape(camera)),
        "image_size": size,
        "time_horizon": 10,
        "batch_size": BATCH,
        "policy": "tiny, FAST (vocab 256), image_shift 4",
        "threads": 1,
        "workers": 0,
        "seconds_per_measurement": args.seconds,
        "png_bytes": folder_bytes(png),
        "video_bytes": folder_bytes(video),
        "video_encoder": {k.removeprefix("video."): v for k, v in video_info.items() if k.startswith("video.")},
        "video_decoder": "pyav (LeRobot's decode_video_frames)",
        "transcode_s": transcode_s,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    from vla.io import write_json
    from vla.provenance import headline_path, quiet_machine

    meta["machine_load"] = quiet_machine([*loads, os.getloadavg()[0]], threads=1)
    out = headline_path(args.out, meta["machine_load"], args.allow_loaded)
    write_json(out, {"meta": meta, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
