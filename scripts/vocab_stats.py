#!/usr/bin/env python
"""How FAST's BPE vocabulary spells a dataset's chunks: for each vocabulary size, the ids per chunk and how often the
ids occur in the fitting chunks, and the size ``vocab_size="auto"`` chooses (``action_tokenizers.rate``).

    python scripts/vocab_stats.py --dataset NAME=DIR[:T] ... [--vocab 64,128,256,512,1024] [--out results/vocab_stats]

Each dataset's training chunks (90% of its episodes, normalised by the exact quantiles of their frames, at the time
horizon T its policy was trained with) are fitted by FAST with the library's defaults and each vocabulary size, then
encoded. Reported per size: ids per chunk (mean), the ids the chunks use, and how often a used id occurs (median,
and the share of id occurrences whose id occurs fewer than 20 times: ids the model sees too rarely to learn).
Writes ``vocab_stats.json`` and ``README.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import action_tokenizers as at
import numpy as np

from vla.compare import load_split
from vla.io import atomic_write_text
from vla.provenance import provenance

RARE = 20  # an id seen fewer times than this in the fitting chunks counts as rare


def spelling(chunks: np.ndarray, vocab_size: int) -> dict[str, float]:
    """FAST fitted on ``chunks`` [N, T, D] with ``vocab_size``: how it spells them."""
    tok = at.FASTTokenizer.fit(chunks, vocab_size=vocab_size)
    ids = tok.encode(chunks)
    lengths = np.array([len(x) for x in ids])
    counts = np.bincount(np.concatenate([np.asarray(x) for x in ids]), minlength=tok.vocab_size)
    used = counts[counts > 0]
    return {
        "vocab_size": int(tok.vocab_size),
        "n_symbols": int(tok.n_symbols),
        "ids_per_chunk": float(lengths.mean()),
        "ids_per_chunk_per_dim": float(lengths.mean() / chunks.shape[2]),
        "used_ids": int(len(used)),
        "median_id_count": float(np.median(used)),
        "rare_share": float(counts[(counts > 0) & (counts < RARE)].sum() / counts.sum()),
        "chunks_per_id": float(len(chunks) / tok.vocab_size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", action="append", required=True, help="NAME=DIR[:T] (T: the time horizon)")
    parser.add_argument("--vocab", default="64,128,256,512,1024")
    parser.add_argument("--out", type=Path, default=Path("results/vocab_stats"))
    args = parser.parse_args()
    sizes = [int(v) for v in args.vocab.split(",")]
    rows = []
    for spec in args.dataset:
        name, _, rest = spec.partition("=")
        root, _, horizon = rest.partition(":")
        split = load_split(Path(root), int(horizon) if horizon else None, heldout=0.1, seed=0, log=lambda *_: None)
        auto = at.FASTTokenizer.fit(split.train)
        print(f"{name}: auto chooses {auto.vocab_size}: {auto.fit_choices['vocab_size']}")
        for size in sizes:
            try:
                row = spelling(split.train, size)
            except ValueError as err:  # an alphabet wider than the vocabulary
                row = {"vocab_size": size, "refused": str(err).split(";")[0]}
            rows.append(
                {
                    "dataset": name,
                    "chunks": len(split.train),
                    "time_horizon": split.time_horizon,
                    "action_dim": int(split.train.shape[2]),
                    "asked": size,
                    "auto": size == auto.vocab_size,
                    **row,
                }
            )
            print(rows[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"rows": rows, "rare_below": RARE, "provenance": provenance(config=vars(args) | {"out": str(args.out)})}
    atomic_write_text(args.out / "vocab_stats.json", json.dumps(record, indent=2, default=str) + "\n")
    lines = [
        "# How FAST's vocabulary spells each dataset (`scripts/vocab_stats.py`)",
        "",
        "| dataset | chunks | T x D | vocabulary | ids per chunk | ids per chunk per dim | used ids | "
        f"median id count | share of rare ids (< {RARE}) |",
        "| --- |" + " --- |" * 8,
    ]
    for r in rows:
        shape = f"{r['time_horizon']} x {r['action_dim']}"
        if "refused" in r:
            lines.append(
                f"| {r['dataset']} | {r['chunks']} | {shape} | {r['asked']} | refused: {r['refused']} | | | | |"
            )
            continue
        size = f"**{r['vocab_size']}** (auto)" if r["auto"] else str(r["vocab_size"])
        lines.append(
            f"| {r['dataset']} | {r['chunks']} | {shape} | {size} | {r['ids_per_chunk']:.1f} | "
            f"{r['ids_per_chunk_per_dim']:.2f} | {r['used_ids']} | {r['median_id_count']:.0f} | "
            f"{r['rare_share']:.1%} |"
        )
    atomic_write_text(args.out / "README.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
