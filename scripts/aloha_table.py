"""Collect the ALOHA closed-loop runs into results/aloha/closed_loop.md and closed_loop.png.

    python scripts/aloha_table.py [--runs results/aloha/runs.json] [--out results/aloha]

``runs.json`` holds one entry per evaluation: the training recipe that the evaluation cannot tell (tokenizer,
demonstrations, steps, and ``time_horizon`` / ``relative_actions`` where they differ from ``configs/aloha.yaml``) and,
under ``evaluation``, what ``vla eval --env aloha ... --out DIR`` wrote (``DIR/eval_info.json``); success, episodes,
ids per chunk, actions run per chunk, temporal ensembling, beam search, latency and the evaluation seeds are read from
it (a run on seeds other than the standard ``EVAL_SEED_START ..`` says where it started: a second sample of episodes,
to check a result chosen on the first). The chart draws one bar per run, grouped by task, with ACT's own success on
each task (transfer-cube ~90%, insertion ~50%) as dashed lines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vla.io import atomic_write_text, save_figure
from vla.sim import EVAL_SEED_START

TARGETS = {"transfer-cube": 0.90, "insertion": 0.50}  # ACT's own success on the two tasks (Zhao et al., 2023)


def load(runs_path: Path) -> list[dict]:
    """One row per run: its recipe and its evaluation's figures."""
    rows = []
    for run in json.loads(runs_path.read_text())["runs"]:
        info = run["evaluation"]
        task = info["env"].split("/", 1)[1]
        tokenizer = run["tokenizer"] + (f", T={run['time_horizon']}" if run.get("time_horizon") else "")
        tokenizer += ", relative" if run.get("relative_actions") else ""
        rows.append(
            {
                **{k: v for k, v in run.items() if k != "evaluation"},
                "tokenizer": tokenizer,
                "task": task,
                "success_rate": info["success_rate"],
                "episodes": info["episodes"],
                "tokens_per_chunk": info["tokens_per_chunk"],
                "n_action_steps": info["n_action_steps"],
                "temporal_ensemble": info.get("temporal_ensemble"),
                "num_beams": info.get("num_beams", 1),
                "latency_ms_mean": info["latency_ms_mean"],
                "seed_start": info["seed_start"],
            }
        )
    return rows


def decoding(row: dict) -> str:
    how = f"beam {row['num_beams']}" if row["num_beams"] > 1 else "greedy"
    if row["temporal_ensemble"] is not None:
        return f"{how}, ensembled every {row['n_action_steps']}"
    return f"{how}, {row['n_action_steps']} run"


def episodes(row: dict) -> str:
    """``50 ep`` on the standard evaluation seeds, ``200 ep from seed 1,000,050`` on another range."""
    if row["seed_start"] == EVAL_SEED_START:
        return f"{row['episodes']} ep"
    return f"{row['episodes']} ep from seed {row['seed_start']:,}"


def table(rows: list[dict]) -> str:
    lines = [
        "| task | tokenizer | demos | steps | decoding, actions run per chunk | ids/chunk | latency ms | success |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['tokenizer']} | {r['demos']} | {r['steps']:,} | {decoding(r)} | "
            f"{r['tokens_per_chunk']:.1f} | {r['latency_ms_mean']:.0f} | "
            f"{r['success_rate']:.1%} ({episodes(r)}) |"
        )
    lines += [
        "",
        "Latency: one observation at a time, from each evaluation at its own machine load (compare orders "
        "of magnitude only). Dashed lines in the chart: ACT's own success, "
        + ", ".join(f"{t} {v:.0%}" for t, v in TARGETS.items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def bar_label(row: dict) -> str:
    """A short x label: tokenizer, data and steps, decoding, and the seeds when not the standard ones."""
    seeds = "" if row["seed_start"] == EVAL_SEED_START else f"\n{row['episodes']} other ep"
    how = decoding(row).replace(", ", "\n")
    return f"{row['tokenizer']}\n{row['demos']} d, {row['steps'] // 1000}k\n{how}{seeds}"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TARGETS if any(r["task"] == t for r in rows)]
    counts = [sum(r["task"] == t for r in rows) for t in tasks]
    fig, axes = plt.subplots(
        1, len(tasks), figsize=(1.0 * sum(counts) + 2, 4.8), squeeze=False, gridspec_kw={"width_ratios": counts}
    )
    for ax, task in zip(axes[0], tasks):
        mine = [r for r in rows if r["task"] == task]
        labels = [bar_label(r) for r in mine]
        colors = ["tab:blue" if r["tokenizer"].startswith("FAST") else "tab:orange" for r in mine]
        bars = ax.bar(range(len(mine)), [r["success_rate"] for r in mine], color=colors)
        ax.bar_label(bars, labels=[f"{r['success_rate']:.0%}" for r in mine], fontsize=8)
        ax.axhline(TARGETS[task], color="k", ls="--", lw=1, label=f"ACT {TARGETS[task]:.0%}")
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set_xlabel("tokenizer / demonstrations, training steps / decoding, actions run per chunk", fontsize=8)
        ax.set_ylim(0, 1.08)
        ax.set_title(f"aloha/{task}")
        ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel("success rate (evaluation episodes)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("results/aloha/runs.json"))
    parser.add_argument("--out", type=Path, default=Path("results/aloha"))
    args = parser.parse_args()
    rows = load(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "closed_loop.md", table(rows))
    plot(rows, args.out / "closed_loop.png")
    print(table(rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
