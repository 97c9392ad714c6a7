#!/usr/bin/env python
"""FAST's vocabulary against closed-loop success: every traced study that trained FAST at more than one vocabulary
on the same data, gathered into curves of success against the vocabulary, against the ids a chunk takes, and (from
the 64 px camera on push-v3) against the number of demonstrations.

    python scripts/vocab_curves.py [--results results] [--out results/vocab_curves]

The cells are listed in ``CELLS`` (study, tokenizer and setting in its ``runs.json``, and the vocabulary the run
trained with: a study file that left the vocabulary to the default records ``auto`` or nothing, so the size that
default chose at the run's commit is written here beside the reason). Success is each run's evaluation; a cell's
mean and spread are over its training seeds. A cell whose study has not run yet is left out and named. Writes
``vocab_curves.json`` (every cell's runs, with provenance), ``README.md`` (the table) and ``vocab_curves.png``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vla.io import atomic_write_text, save_figure, write_json
from vla.provenance import provenance


@dataclass(frozen=True)
class Cell:
    group: str  # the data and recipe: one curve
    study: str
    tokenizer: str  # the study's tokenizer name
    setting: str  # the study's setting name
    vocab: int  # the BPE vocabulary the runs trained with
    demos: int  # demonstrations in the training dataset
    why: str = ""  # how the vocabulary is known when the study file left it to the default


PIXELS = "push-v3, 64 px camera, 4,000 steps"
DEMO = "five-task demo, state, 3,000 steps"
ALOHA = "ALOHA transfer-cube, state, T = 50"
PUBLISHED = "the published rule's 1,024 (vocab_size unset, before auto)"
CELLS = (
    Cell(PIXELS, "push_pixels", "fast", "steps4k", 1024, 200, PUBLISHED),
    Cell(PIXELS, "push_pixels_fast_steps", "fast_vocab128", "steps4k", 128, 200),
    Cell(PIXELS, "push_pixels_vocab256", "v256", "steps4k", 256, 200),
    Cell(PIXELS, "push_pixels_vocab50", "fast", "steps4k", 1024, 50),
    Cell(PIXELS, "push_pixels_vocab50", "v256", "steps4k", 256, 50),
    Cell(PIXELS, "push_pixels_vocab50", "v128", "steps4k", 128, 50),
    Cell(DEMO, "demo_vocab", "fast", "steps3k", 1024, 200, PUBLISHED),
    Cell(DEMO, "demo_vocab", "v256", "steps3k", 256, 200),
    Cell(DEMO, "demo_vocab", "v128", "steps3k", 128, 200),
    Cell(ALOHA, "aloha_cube", "fast", "shipped", 1024, 200, "auto's choice before it counted ids per chunk step"),
    Cell(ALOHA, "aloha_vocab", "fast", "v512", 512, 200),
    Cell(ALOHA, "aloha_vocab", "fast", "v256", 256, 200),
)
COLOURS = {PIXELS: "tab:blue", DEMO: "tab:green", ALOHA: "tab:red"}
# What vocab_size="auto" chooses on each group's data (results/vocab_stats; ALOHA: the rule's 2,500 occurrences,
# 50 x T, met by 256 ids and not by 512, action_tokenizers.rate), by (group, demonstrations)
AUTO = {(PIXELS, 200): 128, (PIXELS, 50): 128, (DEMO, 200): 128, (ALOHA, 200): 256}


def gather(results: Path, cells=CELLS) -> tuple[list[dict], list[str]]:
    """Each cell with its runs (seed, success, ids per chunk) from the studies' ``runs.json``; the cells whose study
    holds no finished run of them, named."""
    rows, missing = [], []
    for cell in cells:
        path = results / cell.study / "runs.json"
        runs = json.loads(path.read_text())["runs"] if path.is_file() else []
        mine = [r for r in runs if r["tokenizer"] == cell.tokenizer and r["setting"] == cell.setting]
        if not mine:
            missing.append(f"{cell.study}: {cell.setting}-{cell.tokenizer}")
            continue
        success = np.array([r["success_rate"] for r in mine])
        ids = np.array([r["tokens_per_chunk"] for r in mine])
        rows.append(
            {
                **asdict(cell),
                "seeds": [r["seed"] for r in mine],
                "success": success.tolist(),
                "tokens_per_chunk": ids.tolist(),
                "mean": float(success.mean()),
                "std": float(success.std(ddof=1)) if len(success) > 1 else None,
                "ids_mean": float(ids.mean()),
                "commits": sorted({r["provenance"]["commit"][:7] for r in mine}),
            }
        )
    return rows, missing


def table(rows: list[dict], missing: list[str]) -> str:
    lines = [
        "| data and recipe | demos | vocabulary | ids per chunk | seeds | mean success | std | per seed | study |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (r["group"], -r["demos"], r["vocab"])):
        std = "n/a" if r["std"] is None else f"{r['std'] * 100:.1f} pts"
        seeds = ", ".join(f"s{s}: {v:.0%}" for s, v in zip(r["seeds"], r["success"]))
        vocab = f"{r['vocab']:,}" + ("*" if r["why"] else "")
        vocab += " (auto)" if AUTO.get((r["group"], r["demos"])) == r["vocab"] else ""
        lines.append(
            f"| {r['group']} | {r['demos']} | {vocab} | {r['ids_mean']:.1f} | {len(r['seeds'])} | "
            f"**{r['mean']:.1%}** | {std} | {seeds} | `{r['study']}` |"
        )
    whys = sorted({r["why"] for r in rows if r["why"]})
    if whys:
        lines += ["", "\\* the study left the vocabulary to the default of its commit: " + "; ".join(whys) + "."]
    if missing:
        lines += ["", "Not run yet: " + "; ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def page(rows: list[dict], missing: list[str]) -> str:
    return (
        "# FAST's vocabulary and closed-loop success (`scripts/vocab_curves.py`)\n\n"
        "Every traced study that trained FAST at more than one BPE vocabulary on the same data and recipe; success "
        "over each run's evaluation episodes (100 on push-v3 and ALOHA, 250 on the five-task demo), mean and std "
        "over training seeds. What the curves say: [docs/tokenizers.md](../../docs/tokenizers.md#the-vocabulary-"
        "in-closed-loop).\n\n"
        "**Reproduce:** `python scripts/vocab_curves.py` (reads `results/<study>/runs.json`).\n\n"
        + table(rows, missing)
        + "\n![success against vocabulary, ids per chunk and demonstrations](vocab_curves.png)\n"
    )


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    by_vocab, by_ids, by_data = axes
    for group, colour in COLOURS.items():
        for demos, style in ((200, "-"), (50, "--")):
            mine = sorted((r for r in rows if r["group"] == group and r["demos"] == demos), key=lambda r: r["vocab"])
            if not mine:
                continue
            label = f"{group}, {demos} demos"
            for ax, x in ((by_vocab, "vocab"), (by_ids, "ids_mean")):
                xs = [r[x] for r in mine]
                ax.errorbar(
                    xs,
                    [r["mean"] for r in mine],
                    yerr=[r["std"] or 0 for r in mine],
                    color=colour,
                    ls=style,
                    marker="o",
                    capsize=3,
                    label=label,
                )
                for r in mine:  # each seed, faint; auto's choice ringed
                    seeds_x = [r[x]] * len(r["success"]) if x == "vocab" else r["tokens_per_chunk"]
                    ax.scatter(seeds_x, r["success"], color=colour, alpha=0.25, s=14)
                    if AUTO.get((group, demos)) == r["vocab"]:
                        ax.scatter([r[x]], [r["mean"]], s=160, facecolors="none", edgecolors="k", lw=1.2)
    for vocab, marker in ((128, "o"), (256, "s"), (1024, "^")):
        mine = sorted((r for r in rows if r["group"] == PIXELS and r["vocab"] == vocab), key=lambda r: r["demos"])
        if mine:
            by_data.errorbar(
                [r["demos"] for r in mine],
                [r["mean"] for r in mine],
                yerr=[r["std"] or 0 for r in mine],
                marker=marker,
                capsize=3,
                label=f"{vocab:,} ids",
            )
    by_vocab.set_xscale("log", base=2)
    by_vocab.set_xticks([128, 256, 512, 1024], ["128", "256", "512", "1,024"])
    by_vocab.set_xlabel("BPE vocabulary (ids)")
    by_ids.set_xscale("log", base=2)
    by_ids.set_xticks([2, 4, 8, 16, 32, 64], ["2", "4", "8", "16", "32", "64"])
    by_ids.minorticks_off()
    by_ids.set_xlabel("ids per chunk (mean over the training chunks; faint: each seed)")
    by_data.set_xlabel("demonstrations (push-v3, 64 px camera, 4,000 steps)")
    by_data.set_xticks([50, 200])
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    by_vocab.set_ylabel("closed-loop success (mean over training seeds, bars: std)")
    by_vocab.set_title("ringed: what vocab_size='auto' chooses", fontsize=9)
    by_vocab.legend(fontsize=7, loc="lower left")
    by_data.legend(fontsize=8)
    fig.suptitle("FAST's vocabulary and closed-loop success")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--out", type=Path, default=Path("results/vocab_curves"))
    args = parser.parse_args()
    rows, missing = gather(args.results)
    if not rows:
        raise SystemExit(f"no study under {args.results} holds a run of the cells in CELLS: run the studies first")
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"cells": rows, "missing": missing, "provenance": provenance(config={"results": str(args.results)})}
    write_json(args.out / "vocab_curves.json", record)
    atomic_write_text(args.out / "README.md", page(rows, missing))
    plot(rows, args.out / "vocab_curves.png")
    print(table(rows, missing), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
