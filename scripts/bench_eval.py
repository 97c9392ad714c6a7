#!/usr/bin/env python
"""Evaluation throughput, end to end: the wall time of `vla eval` on push-v3 from a 64 px camera, old code against
new, with the same policy and the same episodes.

    python scripts/bench_eval.py --before /path/to/an/older/checkout [--after /path/to/a/checkout] \\
        [--episodes 20] [--repeats 3] [--threads 1]

The policy is trained once by the new checkout (``configs/images.yaml``, ``--steps`` steps, on the 20-episode camera
dataset ``scripts/bench_train.py`` records under ``outputs/bench_train/``) and kept under ``outputs/bench_eval/``.
Each measurement is one ``python -m vla.cli eval`` process of the checkout named by its label (``OMP_NUM_THREADS`` =
``--threads``), the checkouts alternating run by run so that all see the same load; the median of the repeats is
reported with the load average beside each run. Old and new code must agree on every episode (success and length):
the script fails otherwise, since a faster evaluation that acts differently measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_train import ensure_datasets, environment

ROOT = Path(__file__).resolve().parents[1]
POLICY = Path("outputs/bench_eval/images")


def ensure_policy(dataset: Path, steps: int) -> Path:
    """A camera policy trained by this checkout (kept: every run evaluates the same weights)."""
    out = (ROOT / POLICY).resolve()
    if not (out / "policy" / "config.json").is_file():
        args = [
            sys.executable,
            "-m",
            "vla.cli",
            "train",
            f"--config_path={ROOT / 'configs' / 'images.yaml'}",
            f"--dataset_root={dataset}",
            f"--output_dir={out}",
            f"--steps={steps}",
            f"--policy.scheduler_decay_steps={steps}",
            "--heldout_episodes=0",
            "--progress=false",
        ]
        done = subprocess.run(args, env=environment(ROOT, 2), capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return out / "policy"


def run(code: Path, policy: Path, episodes: int, threads: int) -> dict:
    """One `vla eval` process of ``code``: its wall time, the load around it and what each episode did."""
    from vla.run_folder import EVAL_INFO

    with tempfile.TemporaryDirectory() as out:
        args = [
            sys.executable,
            "-m",
            "vla.cli",
            "eval",
            "--policy",
            str(policy),
            "--env",
            "metaworld",
            "--task",
            "push-v3",
            "--episodes",
            str(episodes),
            "--out",
            out,
        ]
        load = os.getloadavg()[0]
        start = time.perf_counter()
        done = subprocess.run(args, env=environment(code, threads), capture_output=True, text=True, cwd=code)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
        report = json.loads((Path(out) / EVAL_INFO).read_text())
    return {
        "seconds": round(seconds, 2),
        "steps": int(sum(report["lengths"])),
        "successes": report["successes"],
        "lengths": report["lengths"],
        "load_average": round((load + os.getloadavg()[0]) / 2, 2),
    }


def markdown(record: dict) -> str:
    meta = record["meta"]
    lines = [
        "# Evaluation throughput (`scripts/bench_eval.py`)",
        "",
        f"`vla eval` of one camera policy (configs/images.yaml, {meta['train_steps']} steps) on push-v3 from a 64 px "
        f"camera, {meta['episodes']} episodes ({meta['steps']} simulator steps), {meta['threads']} thread(s), the "
        f"median of {meta['repeats']} runs per code, old and new alternating (load average "
        f"{meta['load_average_min']}-{meta['load_average_max']}). Every episode ended the same way under both codes. "
        "Codes: " + ", ".join(f"{k} = {v}" for k, v in meta["codes"].items()) + ".",
        "",
        "| code | runs | seconds (median) | simulator steps/s | speed-up |",
        "| --- | --- | --- | --- | --- |",
    ]
    before = record["rows"][0]["seconds"]
    for r in record["rows"]:
        lines.append(
            f"| {r['code']} | {len(r['runs'])} | {r['seconds']:.1f} | {meta['steps'] / r['seconds']:.0f} | "
            f"{before / r['seconds']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_eval.json")
    parser.add_argument("--allow-loaded", action="store_true", help="write to --out even when the machine was loaded")
    parser.add_argument("--before", type=Path, required=True, help="the older checkout to measure against")
    parser.add_argument("--after", type=Path, default=ROOT, help="the newer checkout (default: this one)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300, help="training steps of the policy evaluated")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from vla.io import atomic_write_text, write_json
    from vla.provenance import git_state, headline_path, provenance, quiet_machine

    policy = ensure_policy(ensure_datasets(["images"])["images"], args.steps)
    codes = {"before": args.before.resolve(), "after": args.after.resolve()}
    states = {label: git_state(code) for label, code in codes.items()}
    runs: dict[str, list[dict]] = {label: [] for label in codes}
    for _ in range(args.repeats):
        for label, code in codes.items():
            runs[label].append(run(code, policy, args.episodes, args.threads))
            print(json.dumps({"code": label, **{k: runs[label][-1][k] for k in ("seconds", "load_average")}}))
    reference = runs["before"][0]
    for label, results in runs.items():
        for result in results:
            if (result["successes"], result["lengths"]) != (reference["successes"], reference["lengths"]):
                raise RuntimeError(f"{label}'s episodes differ from before's: the two codes do not act alike")
    loads = [r["load_average"] for results in runs.values() for r in results]
    machine = quiet_machine(loads, args.threads)
    record = {
        "meta": {
            "episodes": args.episodes,
            "steps": reference["steps"],
            "threads": args.threads,
            "repeats": args.repeats,
            "train_steps": args.steps,
            "codes": {label: f"{commit}{' (modified)' if dirty else ''}" for label, (commit, dirty) in states.items()},
            "load_average_min": min(loads),
            "load_average_max": max(loads),
            "machine": machine,
        },
        "rows": [
            {
                "code": label,
                "runs": [r["seconds"] for r in results],
                "seconds": float(np.median([r["seconds"] for r in results])),
            }
            for label, results in runs.items()
        ],
        "provenance": provenance(config={k: str(v) for k, v in vars(args).items()} | {"policy": str(POLICY)}),
    }
    out = headline_path(args.out, machine, args.allow_loaded)
    write_json(out, record)
    atomic_write_text(out.with_suffix(".md"), markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
