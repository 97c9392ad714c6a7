#!/usr/bin/env python
"""Training throughput: samples/s and tokens/s of one optimiser step, per preset and tokenizer.

    python scripts/bench_train.py --out results/bench_train.json [--presets tiny,small] [--steps 10]
        [--state-encodings text,embedding]

Runs on the default Meta-World dataset (recorded first if missing), state only, batch 32, AdamW; the first two
steps are warm-up and not timed. On a machine with CUDA it measures there too (bf16 autocast).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from vla import data, train
from vla.config import BinConfig, FASTConfig, PolicyOptions, TrainConfig
from vla.sim.record import DEFAULT_DATASET_ROOT, ensure_dataset


def measure(preset: str, tokenizer, device: str, steps: int, batch_size: int, state_encoding: str = "text") -> dict:
    cfg = TrainConfig(
        dataset_root=str(DEFAULT_DATASET_ROOT), tokenizer=tokenizer, batch_size=batch_size, progress=False,
        policy=PolicyOptions(preset=preset, time_horizon=10, n_action_steps=5, state_encoding=state_encoding),
    )  # fmt: skip
    info = data.dataset_info(cfg.dataset_root)
    episodes = info.episode_index.tolist()
    policy = train.build_policy(cfg, info, episodes).to(device).train()
    dataset = data.ActionChunkDataset(cfg.dataset_root, 10, episodes=episodes, backend="memory")
    loader = iter(train.make_loader(cfg, dataset, 0, 0, 1))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    times, tokens = [], 0
    for step in range(steps + 2):
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in next(loader).items()}
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss, metrics = policy(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
            tokens += int(metrics["suffix_tokens"])  # the tokens the loss is computed on
    seconds = sum(times)
    return {
        "preset": preset,
        "tokenizer": tokenizer.type,
        "state_encoding": state_encoding,
        "device": device,
        "batch_size": batch_size,
        "params_m": sum(p.numel() for p in policy.parameters()) / 1e6,
        "step_ms": 1000 * seconds / len(times),
        "samples_per_s": batch_size * len(times) / seconds,
        "suffix_tokens_per_s": tokens / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_train.json"))
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--state-encodings", default="text,embedding", help="policy.state_encoding values to measure")
    args = parser.parse_args()
    ensure_dataset()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for preset in args.presets.split(","):
            for tok in (FASTConfig(), BinConfig()):
                for encoding in args.state_encodings.split(","):
                    row = measure(preset, tok, device, args.steps, args.batch_size, encoding)
                    print(json.dumps(row))
                    rows.append(row)
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
