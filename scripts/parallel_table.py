"""Collect the autoregressive-vs-parallel comparison into results/parallel/: parallel.json, parallel.md, parallel.png.

    python scripts/parallel_table.py --runs outputs/parallel/runs [--bench results/parallel/bench_decode.json]

``--runs`` holds one training run per (tokenizer, decoding), named ``{tokenizer}_ar`` / ``{tokenizer}_par``, each
trained by ``vla train --config_path configs/{tokenizer}.yaml`` (``--policy.decoding=parallel`` for ``_par``) and
evaluated with ``vla eval --policy RUN/policy --out RUN/eval``. Per run: the final logged loss and next-token
accuracy on the action ids (``metrics.jsonl``; the autoregressive loss also covers "Action: ", "|" and EOS, the
parallel one only the action slots, so the accuracies are the comparable number), closed-loop success and the
batch-of-one latency per chunk (``eval/eval_info.json``). ``--bench``: ``scripts/bench_decode.py``'s rows with
``--decoders lean parallel`` (random weights, batch 1), added per preset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vla.run_folder import EVAL_INFO, RunFolder

DECODINGS = {"ar": "autoregressive", "par": "parallel"}


def run_row(run: Path) -> dict | None:
    rows = RunFolder(run).metrics_rows()
    if not rows:
        return None
    last = rows[-1]
    row = {
        "steps": last["step"],
        "final_loss": last["loss"],
        "final_accuracy": last["accuracy"],
        "tokens_per_chunk": last.get("tokens_per_chunk"),
    }
    info = run / "eval" / EVAL_INFO
    if info.is_file():
        e = json.loads(info.read_text())
        row.update(
            success_rate=e["success_rate"],
            episodes=e["episodes"],
            latency_ms_mean=e["latency_ms_mean"],
            latency_ms_p95=e["latency_ms_p95"],
            valid_chunk_rate=e["valid_chunk_rate"],
        )
    return row


def bench_rows(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    rows = json.loads(path.read_text())["rows"]
    keep = ("preset", "tokenizer", "decoder", "latency_ms_p50", "latency_ms_p95", "decode_steps", "tokens_per_chunk")
    return [{k: r[k] for k in keep} for r in rows if r["constrained"] and r["decoder"] in ("lean", "parallel")]


def table(runs: list[dict], bench: list[dict]) -> str:
    lines = [
        "| tokenizer | decoding | ids/chunk | steps | final loss | action-id accuracy | success | "
        "eval latency ms (mean / p95) | valid chunks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    # accuracy: autoregressive = teacher-forced next-token accuracy; parallel = every slot at once (what it decodes)
    for r in runs:
        success = f"{r['success_rate']:.0%} ({r['episodes']} ep)" if "success_rate" in r else "not run"
        latency = f"{r['latency_ms_mean']:.1f} / {r['latency_ms_p95']:.1f}" if "latency_ms_mean" in r else "-"
        valid = f"{r['valid_chunk_rate']:.1%}" if "valid_chunk_rate" in r else "-"
        lines.append(
            f"| {r['tokenizer']} | {r['decoding']} | {r['tokens_per_chunk']:.0f} | {r['steps']} | "
            f"{r['final_loss']:.3f} | {r['final_accuracy']:.1%} | {success} | {latency} | {valid} |"
        )
    if bench:
        lines += [
            "",
            "Decode latency, random weights, batch 1 (`scripts/bench_decode.py --decoders lean parallel`):",
            "",
            "| preset | tokenizer | decoding | ids/chunk | forward passes | latency ms (p50 / p95) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for b in bench:
            name = "parallel" if b["decoder"] == "parallel" else "autoregressive (lean)"
            lines.append(
                f"| {b['preset']} | {b['tokenizer']} | {name} | {b['tokens_per_chunk']:.0f} | "
                f"{b['decode_steps']} | "
                f"{b['latency_ms_p50']:.2f} / {b['latency_ms_p95']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], bench: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from vla.io import save_figure

    toks = list(dict.fromkeys(r["tokenizer"] for r in runs))
    # eval latencies are left out of the plot: the runs were evaluated at different machine loads
    panels = [("success_rate", "closed-loop success (push-v3)"), ("final_accuracy", "action-id accuracy (train)")]
    fig, axes = plt.subplots(1, len(panels) + bool(bench), figsize=(4.2 * (len(panels) + bool(bench)), 3.6))
    x = np.arange(len(toks))
    for ax, (key, title) in zip(axes, panels):
        for k, (short, label) in enumerate(DECODINGS.items()):
            values = [
                next((r.get(key, np.nan) for r in runs if r["tokenizer"] == t and r["decoding"] == label), np.nan)
                for t in toks
            ]
            ax.bar(x + (k - 0.5) * 0.38, values, 0.38, label=label)
        ax.set_xticks(x, toks)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    if bench:
        ax = axes[-1]
        labels = list(dict.fromkeys(f"{b['preset']}/{b['tokenizer']}" for b in bench))
        xb = np.arange(len(labels))
        for k, decoder in enumerate(("lean", "parallel")):
            values = [
                next(
                    (
                        b["latency_ms_p50"]
                        for b in bench
                        if f"{b['preset']}/{b['tokenizer']}" == lab and b["decoder"] == decoder
                    ),
                    np.nan,
                )
                for lab in labels
            ]
            ax.bar(xb + (k - 0.5) * 0.38, values, 0.38, label="autoregressive" if decoder == "lean" else "parallel")
        ax.set_xticks(xb, labels, rotation=30, fontsize=8)
        ax.set_yscale("log")
        ax.set_title("decode latency, batch 1 (ms, p50)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--bench", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--settings", default="", help="a line describing the runs, put above the table")
    args = parser.parse_args()
    runs = []
    for tok in ("bin", "fsq", "beast"):
        for short, label in DECODINGS.items():
            row = run_row(args.runs / f"{tok}_{short}")
            if row is not None:
                runs.append({"tokenizer": tok, "decoding": label, **row})
    bench = bench_rows(args.bench)
    from vla.io import atomic_write_text

    atomic_write_text(
        args.out / "parallel.json",
        json.dumps({"settings": args.settings, "runs": runs, "bench": bench}, indent=2) + "\n",
    )
    atomic_write_text(args.out / "parallel.md", (args.settings + "\n\n" if args.settings else "") + table(runs, bench))
    plot(runs, bench, args.out / "parallel.png")
    print(table(runs, bench))


if __name__ == "__main__":
    main()
