"""``vla compare``'s outputs: ``compare.json``, ``compare.md`` (the recommendation, then the table) and the PNG plots
(ids per chunk against error, error per dimension, the distribution of chunk lengths)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vla.io import atomic_write_text, save_figure, write_json


def fit_cell(r: dict[str, Any]) -> str:
    """Fit time, with the steps run and why they stopped where the tokenizer reports them (FSQ)."""
    report = r.get("fit_report") or {}
    if "steps" in report:
        return f"{r['fit_seconds']:.1f} ({report['steps']} steps, {report['stopped']})"
    return f"{r.get('fit_seconds', float('nan')):.1f}"


def recommendation_text(results: dict[str, Any]) -> str:
    """The answer in three lines: which tokenizer at which rate and chunk, why, and the ``vla train`` command; ""
    when the results hold no recommendation (``vla tokenizer fit``'s report)."""
    rec = results.get("recommendation")
    if not rec:
        return ""
    rows, bound, ranked = results["tokenizers"], results["max_rmse"], rec["ranked"]
    pick = rows[rec["tokenizer"]]
    t, fps = results["time_horizon"], results["fps"]
    seconds = t / fps
    head = (
        f"recommendation: {rec['tokenizer']}, {pick['tokens_per_chunk_mean']:.1f} ids per chunk "
        f"({pick['tokens_per_chunk_mean'] / seconds:.0f} a second) at held-out RMSE {pick['rmse']:.4f}, "
        f"on chunks of T={t} ({seconds:g} s at {fps:g} fps, {results['time_horizon_why']})"
    )
    if rec["within_bound"]:
        why = f"the fewest ids among the {len(ranked)} entries whose held-out chunks all decode within RMSE {bound:g}"
        if len(ranked) > 1:
            runner = rows[ranked[1]]
            why += f" (next: {ranked[1]}, {runner['tokens_per_chunk_mean']:.1f} ids at {runner['rmse']:.4f})"
        over = [k for k in rows if k not in ranked]
        if over:
            why += "; over the bound or not always decodable: " + ", ".join(
                f"{k} ({rows[k]['rmse']:.4f}, {rows[k]['valid_rate_heldout']:.0%} valid)" for k in over
            )
    else:
        why = (
            f"none decodes every held-out chunk within RMSE {bound:g}, so the lowest error; raise --max-rmse, or "
            "try finer settings with --sweep"
        )
    notes = [
        f"{k} fitted {r['fit_report']['steps']} steps only ("
        + ("its time budget, --fsq-max-seconds" if r["fit_report"]["stopped"] == "time" else "--fsq-steps")
        + "; vla train fits up to 3000): its error is an upper bound"
        for k, r in rows.items()
        if r.get("fit_report", {}).get("stopped") in ("steps", "time") and r["fit_report"]["steps"] < 3000
    ]
    given = "" if "given" not in results["time_horizon_why"] else f" --policy.time_horizon={t}"
    command = f"vla train --dataset_root={results['dataset']} {' '.join(rec['train_flags'])}{given}"
    lines = [head, f"  why: {why}."] + [f"  note: {n}." for n in notes]
    lines.append(f"  next: {command}  (an offline measure: confirm closed-loop success with vla study)")
    return "\n".join(lines) + "\n"


def markdown_table(results: dict[str, Any]) -> str:
    head = (
        f"T={results['time_horizon']}, D={results['action_dim']}, {results['n_heldout_chunks']} held-out chunks "
        f"(error in normalised units; tolerance {results['tolerance']})\n\n"
        "| tokenizer | vocab | tokens/chunk (mean / p99 / max) | compression | RMSE | MAE | max abs | "
        "share > tol | fit s | encode /s | decode /s | vocab used | valid random | valid corrupted | "
        "valid constrained |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    for name, r in results["tokenizers"].items():
        rows.append(
            f"| {name} | {r['vocab_size']} | {r['tokens_per_chunk_mean']:.1f} / {r['tokens_per_chunk_p99']:.0f} / "
            f"{r['tokens_per_chunk_max']} | {r['compression']:.2f}x | {r['rmse']:.4f} | {r['mae']:.4f} | "
            f"{r['max_abs']:.3f} | {r['share_max_error_above_tol']:.3f} | {fit_cell(r)} | "
            f"{r['encode_chunks_per_s']:,.0f} | "
            f"{r['decode_chunks_per_s']:,.0f} | {r['vocab_used']:.2f} | {r['valid_rate_random']:.2f} | "
            f"{r['valid_rate_corrupted']:.2f} | {r['valid_rate_constrained']:.2f} |"
        )
    return head + "\n".join(rows) + "\n"


def write_outputs(results: dict[str, Any], out_dir: Path, name: str = "compare") -> None:
    """``<name>.json``, ``<name>.md`` and the three plots into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / f"{name}.json", results)
    answer = recommendation_text(results)
    atomic_write_text(out_dir / f"{name}.md", (answer + "\n" if answer else "") + markdown_table(results))
    toks = results["tokenizers"]

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in toks.items():
        ax.scatter(r["tokens_per_chunk_mean"], r["rmse"], label=name, zorder=3)
    for name, points in results.get("sweep", {}).items():
        ax.plot(
            [p["tokens_per_chunk_mean"] for p in points], [p["rmse"] for p in points], "-o", ms=3, label=f"{name} sweep"
        )
    ax.set(
        xlabel="tokens per chunk (mean)",
        ylabel="RMSE (normalised)",
        xscale="log",
        yscale="log",
        title="rate-distortion on held-out chunks",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir / "rate_distortion.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(len(toks), 1)
    for k, (name, r) in enumerate(toks.items()):
        per_dim = r["rmse_per_dim"]
        ax.bar(np.arange(len(per_dim)) + k * width, per_dim, width, label=name)
    ax.set(xlabel="action dimension", ylabel="RMSE (normalised)", title="error per dimension")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir / "per_dim_error.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in toks.items():
        counts = np.asarray(r["token_lengths"], dtype=float)
        ax.step(np.arange(len(counts)), counts / counts.sum(), where="mid", label=name)
    ax.set(xlabel="tokens per chunk", ylabel="share of chunks", title="token-length histogram")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir / "token_lengths.png")
