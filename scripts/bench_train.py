#!/usr/bin/env python
"""Training throughput, end to end: samples/s of `vla train` (loading, tokenising, packing, forward, backward, the
optimiser and EMA step, one checkpoint) per recipe and number of torch threads, old code against new.

    python scripts/bench_train.py --before /path/to/an/older/checkout [--after /path/to/a/checkout] \\
        [--recipes fast,images,aloha] [--threads 1,2] [--steps 100] [--repeats 3] [--compiled] [--side-by-side] \\
        [--train-args="--tokenizer.vocab_size=1024"]

Each measurement is one `python -m vla.cli train` process (batch 32, ``configs/<recipe>.yaml``, no held-out
episodes, ``--num_workers=0``, ``OMP_NUM_THREADS`` = the thread count) of the checkout named by its label, on a small
dataset this script records once under ``outputs/bench_train/`` (``vla data record``): push-v3 state (``fast``),
push-v3 from a 64 px camera with proprioception (``images``), ALOHA transfer-cube at 50 Hz, 14-D (``aloha``).
The checkouts run with the same interpreter, alternating run by run (recipe, threads, code), so that all see the
same load on a shared machine; the median of the repeats is reported, with the machine's load average beside each
run; the files are rewritten after every round of runs. ``--compiled`` also runs the new checkout with
``--compile=true`` (``torch.compile`` of the layers). ``--side-by-side`` also runs each checkout as two one-thread
processes of the same recipe at once, as ``vla study`` runs two trainings on two cores: each process's rate is one run
of that cell (``processes`` 2), to set beside one process alone on one thread. ``--train-args`` pins settings for
both checkouts: code whose defaults choose differently (FAST's vocabulary, chosen from the data since ``auto``) would
otherwise train another model, and its rate would say nothing about the code.

Two rates per run: ``samples_per_s``, the trainer's own (every step, the first included, and the final checkpoint),
and ``steady_samples_per_s`` from its metrics (logged every 10 steps) over the steps after the first 20, which leaves
out warm-up (and compilation, for ``--compiled``). ``final_loss``: the loss at the last step; the runs are seeded, so
old and new code see the same batches and start from the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path("outputs/bench_train")
# recipe -> (config, dataset folder, `vla data record` arguments)
RECIPES = {
    "fast": ("fast", "push", ["--episodes", "20"]),
    "images": (
        "images",
        "pixels",
        [
            "--episodes",
            "20",
            "--observation",
            "proprio",
            "--images",
            "--camera",
            "observation.images.workspace",
            "--image-size",
            "64",
        ],
    ),
    "aloha": ("aloha", "aloha", ["--env", "aloha", "--task", "transfer-cube", "--episodes", "6"]),
}
LOG_EVERY, WARMUP_STEPS, BATCH = 10, 20, 32


def environment(code: Path, threads: int) -> dict[str, str]:
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=f"{code}:{code / 'tokenizers'}",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )


def ensure_datasets(recipes: list[str]) -> dict[str, Path]:
    roots = {}
    for name in recipes:
        _, folder, record = RECIPES[name]
        root = (ROOT / DATA / folder).resolve()
        if not (root / "meta" / "info.json").is_file():
            args = [sys.executable, "-m", "vla.cli", "data", "record", *record, "--root", str(root), "--quiet"]
            done = subprocess.run(args, env=environment(ROOT, 1), capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
        roots[name] = root
    return roots


def run(code: Path, recipe: str, dataset: Path, threads: int, steps: int, extra: list[str]) -> dict:
    config = RECIPES[recipe][0]
    with tempfile.TemporaryDirectory() as out:
        args = [
            sys.executable,
            "-m",
            "vla.cli",
            "train",
            f"--config_path={code / 'configs' / f'{config}.yaml'}",
            f"--dataset_root={dataset}",
            f"--output_dir={out}",
            f"--steps={steps}",
            f"--save_every={steps}",
            f"--log_every={LOG_EVERY}",
            "--heldout_episodes=0",
            "--num_workers=0",
            "--progress=false",
            *extra,
        ]
        load = os.getloadavg()[0]
        done = subprocess.run(args, env=environment(code, threads), capture_output=True, text=True, cwd=code)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
        from vla.run_folder import RunFolder

        rows = RunFolder(out).metrics_rows()
    rate = float(re.search(r"([0-9.]+) samples/s", done.stdout).group(1))
    elapsed = {r["step"]: r["step"] * BATCH / r["samples_per_s"] for r in rows}  # seconds since the loop started
    first, last = WARMUP_STEPS, max(elapsed)
    steady = (last - first) * BATCH / (elapsed[last] - elapsed[first])
    return {
        "samples_per_s": rate,
        "steady_samples_per_s": round(steady, 2),
        "final_loss": rows[-1]["loss"],
        "losses": [r["loss"] for r in rows],
        "load_average": round((load + os.getloadavg()[0]) / 2, 2),
    }


def loss_curves(args) -> None:
    """Old and new code's training loss at equal steps (``micro`` preset, configs/fast.yaml, log every 10 steps, the
    same seed): ``<out>_loss.png`` and ``<out>_loss.json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vla.io import save_figure, write_json
    from vla.provenance import provenance

    dataset = ensure_datasets(["fast"])["fast"]
    extra = ["--policy.preset=micro", f"--policy.scheduler_decay_steps={args.loss_curve_steps}"]
    curves = {
        label: run(code.resolve(), "fast", dataset, 1, args.loss_curve_steps, extra)["losses"]
        for label, code in (("before", args.before), ("after", args.after))
    }
    steps = [LOG_EVERY * (i + 1) for i in range(len(curves["before"]))]
    gap = [abs(a - b) / a for a, b in zip(curves["before"], curves["after"])]
    stem = args.out.with_name(args.out.stem + "_loss")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, style in (("before", "-"), ("after", "--")):
        ax.plot(steps, curves[label], style, label=f"{label} ({args.before if label == 'before' else args.after})")
    ax.set(
        xlabel="step",
        ylabel="training loss (batch of 32)",
        yscale="log",
        title=f"micro, configs/fast.yaml: largest relative gap {max(gap):.1e}",
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, stem.with_suffix(".png"))
    write_json(
        stem.with_suffix(".json"),
        {
            "steps": steps,
            "losses": curves,
            "max_relative_gap": max(gap),
            "provenance": provenance(
                config={"preset": "micro", "recipe": "fast", "steps": args.loss_curve_steps}, dataset=dataset
            ),
        },
    )
    print(f"wrote {stem.with_suffix('.png')}: largest relative gap {max(gap):.2e}")


def markdown(record: dict) -> str:
    meta = record["meta"]
    lines = [
        "# Training throughput (`scripts/bench_train.py`)",
        "",
        f"`vla train`, batch {BATCH}, {meta['steps']} steps, `--num_workers=0`, the median of each cell's runs (up to "
        f"{meta['repeats']}), old and new code alternating run by run on {meta['cpus']} shared cores (load average "
        f"{meta['load_average_min']}-{meta['load_average_max']} during the runs). Steady: steps {WARMUP_STEPS}-"
        f"{meta['steps']} from the trainer's metrics; end to end: the trainer's own figure (warm-up and the final "
        "checkpoint included). Codes: " + ", ".join(f"{k} = {v}" for k, v in meta["codes"].items()) + ".",
        "",
        "| recipe | threads | code | runs | steady samples/s | end-to-end samples/s | speed-up (steady) | "
        "speed-up (end to end) | final loss | side by side / alone (end to end) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = record["rows"]

    def key(r: dict) -> tuple:
        return r["recipe"], r["threads"], r.get("processes", 1)

    base = {key(r): r for r in rows if r["code"] == "before"}
    alone = {(r["recipe"], r["code"]): r for r in rows if r["threads"] == 1 and r.get("processes", 1) == 1}
    for r in rows:
        ref = base.get(key(r))
        speed = f"{r['steady_samples_per_s'] / ref['steady_samples_per_s']:.2f}x" if ref else ""
        whole = f"{r['samples_per_s'] / ref['samples_per_s']:.2f}x" if ref else ""
        processes = r.get("processes", 1)
        one = alone.get((r["recipe"], r["code"]))
        pair = f"{r['samples_per_s'] / one['samples_per_s']:.2f}" if processes > 1 and one else ""
        threads = f"{r['threads']}, {processes} processes at once" if processes > 1 else str(r["threads"])
        lines.append(
            f"| {r['recipe']} | {threads} | {r['code']} | {len(r['runs'])} | "
            f"{r['steady_samples_per_s']:.1f} | {r['samples_per_s']:.1f} | {speed} | {whole} | "
            f"{r['final_loss']:.4f} | {pair} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_train.json")
    parser.add_argument(
        "--allow-loaded",
        action="store_true",
        help="write to --out even when the machine was loaded (default: beside it, as <stem>.loaded.json)",
    )
    parser.add_argument("--before", type=Path, required=True, help="the older checkout to measure against")
    parser.add_argument("--after", type=Path, default=ROOT, help="the newer checkout (default: this one)")
    parser.add_argument("--recipes", default="fast,images,aloha")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="also run the new checkout with --compile=true")
    parser.add_argument(
        "--side-by-side", action="store_true", help="also run two one-thread processes at once, as vla study does"
    )
    parser.add_argument(
        "--train-args",
        default="",
        help="vla train arguments for every run of both checkouts, one string (e.g. '--tokenizer.vocab_size=1024': "
        "the same vocabulary for code whose default chooses another, so that both do the same work)",
    )
    parser.add_argument(
        "--loss-curve-steps",
        type=int,
        default=0,
        help="instead: old and new code's loss curves over this many steps (micro preset)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.loss_curve_steps:
        loss_curves(args)
        return
    recipes = args.recipes.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    if args.steps < WARMUP_STEPS + 2 * LOG_EVERY:
        raise ValueError(f"--steps must be at least {WARMUP_STEPS + 2 * LOG_EVERY} (warm-up plus two metrics lines)")
    roots = ensure_datasets(recipes)
    shared = shlex.split(args.train_args)
    codes = {"before": (args.before.resolve(), shared), "after": (args.after.resolve(), shared)}
    if args.compiled:
        codes["after_compiled"] = (args.after.resolve(), [*shared, "--compile=true"])
    from vla.provenance import git_state

    # Each checkout's commit, read before any run (the results file this script writes may lie inside one).
    states = {label: git_state(code) for label, (code, _) in codes.items()}
    # (threads per process, processes at once): each thread count alone, then two one-thread processes side by side
    layouts = [(n, 1) for n in threads] + ([(1, 2)] if args.side_by_side else [])
    runs: dict[tuple, list[dict]] = {}
    for repeat in range(args.repeats):
        for recipe in recipes:
            for n, processes in layouts:
                for label, (code, extra) in codes.items():
                    with ThreadPoolExecutor(processes) as pool:
                        jobs = [
                            pool.submit(run, code, recipe, roots[recipe], n, args.steps, extra)
                            for _ in range(processes)
                        ]
                        results = [job.result() for job in jobs]
                    runs.setdefault((recipe, n, processes, label), []).extend(results)
                    for result in results:
                        shown = {k: v for k, v in result.items() if k != "losses"}
                        row = {"recipe": recipe, "threads": n, "processes": processes, "code": label, **shown}
                        print(json.dumps(row), flush=True)
        write(args, recipes, threads, codes, states, runs, repeat + 1)  # every finished round: a complete file


def write(args, recipes: list[str], threads: list[int], codes: dict, states: dict, runs: dict, repeats: int) -> None:
    from vla.io import atomic_write_text, write_json
    from vla.provenance import headline_path, provenance, quiet_machine

    rows = []
    for (recipe, n, processes, label), results in runs.items():
        rows.append(
            {
                "recipe": recipe,
                "config": f"configs/{RECIPES[recipe][0]}.yaml",
                "threads": n,
                "processes": processes,
                "code": label,
                "steady_samples_per_s": float(np.median([r["steady_samples_per_s"] for r in results])),
                "samples_per_s": float(np.median([r["samples_per_s"] for r in results])),
                "final_loss": float(np.median([r["final_loss"] for r in results])),
                "runs": [{k: v for k, v in r.items() if k != "losses"} for r in results],
            }
        )
    loads = [r["load_average"] for rs in runs.values() for r in rs]
    commits = {}
    for label, (_, extra) in codes.items():
        commit, dirty = states[label]
        commits[label] = (
            f"{commit[:12]}{' (uncommitted changes)' if dirty else ''}{' ' + ' '.join(extra) if extra else ''}"
        )
    meta = {
        "cpus": os.cpu_count(),
        "batch_size": BATCH,
        "steps": args.steps,
        "repeats": repeats,
        "warmup_steps": WARMUP_STEPS,
        "codes": commits,
        "load_average_min": min(loads),
        "load_average_max": max(loads),
        # quiet when no run's load passed the most threads the benchmark itself runs at once (plus QUIET_EXTRA_LOAD):
        # the 1-minute average lags, so a one-thread run right after a two-thread cell still carries that cell's load
        "quiet": quiet_machine(loads, max(n * k for _, n, k, _ in runs))["quiet"],
        "datasets": {k: {"root": str(DATA / RECIPES[k][1]), "record": RECIPES[k][2]} for k in recipes},
    }
    record = {
        "meta": meta,
        "rows": rows,
        "provenance": provenance(
            config={"recipes": recipes, "threads": threads, "steps": args.steps, "repeats": repeats, "codes": commits}
        ),
    }
    machine = quiet_machine(loads, max(n * k for _, n, k, _ in runs))  # the verdict meta records, and its numbers
    out = headline_path(args.out, machine, args.allow_loaded)
    write_json(out, record)
    atomic_write_text(out.with_suffix(".md"), markdown(record))
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
