#!/usr/bin/env python
"""Training throughput, end to end: samples/s of `vla train` (loading, tokenising, packing and the optimiser step),
per preset, tokenizer and number of DataLoader workers.

    python scripts/bench_train.py --out results/bench_train.json [--presets tiny] [--workers 0,2] [--steps 60]
    python scripts/bench_train.py --before /path/to/an/older/checkout ...   # the same runs on both, interleaved

Each configuration is one `python -m vla.cli train` process on the default Meta-World dataset (recorded first if
missing; state only, batch 32, configs/<tokenizer>.yaml), timed by the trainer itself over all its steps (one
checkpoint included), ``--repeats`` times. ``--before`` runs another checkout of this project with the same
interpreter too, alternating with this one run by run, so that both see the same load on a shared machine; the
median of the repeats is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run(code: Path, tokenizer: str, preset: str, workers: int, steps: int, dataset: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=f"{code}:{code / 'tokenizers'}")
    with tempfile.TemporaryDirectory() as out:
        args = [sys.executable, "-m", "vla.cli", "train", f"--config_path={code / 'configs' / f'{tokenizer}.yaml'}",
                f"--dataset_root={dataset}", f"--output_dir={out}", f"--steps={steps}", f"--save_every={steps}",
                f"--num_workers={workers}", "--progress=false", f"--policy.preset={preset}"]  # fmt: skip
        done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=code)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    rate = float(re.search(r"([0-9.]+) samples/s", done.stdout).group(1))
    return {"tokenizer": tokenizer, "preset": preset, "num_workers": workers, "steps": steps, "samples_per_s": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_train.json")
    parser.add_argument("--before", type=Path, default=None, help="an older checkout to measure beside this one")
    parser.add_argument("--presets", default="tiny")
    parser.add_argument("--tokenizers", default="fast,bin")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from vla.sim.record import DEFAULT_DATASET_ROOT, ensure_dataset

    dataset = (ROOT / DEFAULT_DATASET_ROOT).resolve()
    ensure_dataset(dataset)
    codes = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    rows = []
    for preset in args.presets.split(","):
        for tokenizer in args.tokenizers.split(","):
            for workers in [int(w) for w in args.workers.split(",")]:
                rates: dict[str, list[float]] = {label: [] for label in codes}
                for _ in range(args.repeats):
                    for label, code in codes.items():
                        rates[label].append(run(code, tokenizer, preset, workers, args.steps, dataset)["samples_per_s"])
                for label, values in rates.items():
                    row = {"code": label, "tokenizer": tokenizer, "preset": preset, "num_workers": workers,
                           "steps": args.steps, "samples_per_s": float(np.median(values)), "runs": values}  # fmt: skip
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    commits = {label: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code, capture_output=True,
                                     text=True).stdout.strip() for label, code in codes.items()}  # fmt: skip
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "dataset": str(DEFAULT_DATASET_ROOT),
            "batch_size": 32, "commits": commits, "repeats": args.repeats}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
