#!/usr/bin/env python
"""Tokenizer benchmark: FAST's encode+decode throughput against the reference per-chunk loop, and tokens per
chunk / reconstruction error of every tokenizer on the same held-out data.

    python scripts/bench_tokenizers.py --out results/bench_tokenizers.json [--n 10000] [--fsq-steps 3000]

Data: smooth synthetic chunks [T=10, D=7] (``action_tokenizers.synthetic``), fitted on one set, measured on
another. ``--root DATASET`` measures on a LeRobot dataset's action chunks instead (quantile-normalised).
The reference loop is ``action_tokenizers.reference``: the published algorithm, one chunk at a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

import action_tokenizers as at
from action_tokenizers import reference
from action_tokenizers.synthetic import smooth_chunks


def best_time(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def quality(tok: at.ActionTokenizer, chunks: np.ndarray) -> dict:
    ids = tok.encode(chunks)
    out = tok.decode(ids, time_horizon=chunks.shape[1], action_dim=chunks.shape[2])
    lengths = np.array([len(r) for r in ids])
    err = (out.actions - chunks)[out.valid]  # invalid chunks (byte-level drops) are NaN: counted, not averaged
    return {
        "vocab_size": tok.vocab_size,
        "tokens_per_chunk_mean": float(lengths.mean()),
        "tokens_per_chunk_max": int(lengths.max()),
        "compression": float(chunks.shape[1] * chunks.shape[2] / lengths.mean()),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "max_abs": float(np.abs(err).max()),
        "valid_rate": float(out.valid.mean()),
        "invalid_chunks": int((~out.valid).sum()),
    }


def load_data(args) -> tuple[np.ndarray, np.ndarray, str]:
    if args.root is None:
        return smooth_chunks(args.n, 10, 7, seed=0), smooth_chunks(args.n, 10, 7, seed=1), "synthetic smooth [10, 7]"
    from vla.data import action_chunks, frame_stats, split_episodes

    train_eps, held_eps = split_episodes(args.root, heldout=0.2, seed=0)
    norm = at.Normalizer.from_stats(frame_stats(args.root, ["action"], episodes=train_eps)["action"])
    train, _ = action_chunks(args.root, args.time_horizon, episodes=train_eps)
    held, _ = action_chunks(args.root, args.time_horizon, episodes=held_eps)
    return norm.normalize(train), norm.normalize(held), f"{args.root} T={args.time_horizon}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_tokenizers.json"))
    parser.add_argument("--n", type=int, default=10_000, help="chunks to fit on and to measure on")
    parser.add_argument("--fsq-steps", type=int, default=3000)
    parser.add_argument("--root", type=Path, default=None, help="a LeRobot dataset instead of synthetic data")
    parser.add_argument("--time-horizon", type=int, default=15)
    args = parser.parse_args()
    train, held, data_name = load_data(args)
    results: dict = {
        "data": data_name,
        "n_fit": len(train),
        "n_measure": len(held),
        "machine": {"cpu_count": torch.get_num_threads(), "python": platform.python_version()},
    }

    # --- throughput: vectorised FAST vs the reference per-chunk loop, same BPE ----------------------------
    tok = at.FASTTokenizer.fit(train, byte_level=True)
    bpe, min_token = tok.bpe, tok.min_token
    t, d = held.shape[1:]
    ref_s = best_time(lambda: reference.decode(bpe, reference.encode(bpe, held, tok.scale, min_token), tok.scale, min_token, t, d))
    ours_bl_s = best_time(lambda: tok.decode(tok.encode(held)))
    char = at.FASTTokenizer.fit(train)
    ours_s = best_time(lambda: char.decode(char.encode(held)))
    enc_s = best_time(lambda: char.encode(held))
    ids = char.encode(held)
    dec_s = best_time(lambda: char.decode(ids))
    results["throughput_chunks_per_s"] = {
        "reference_loop_encode_decode": len(held) / ref_s,
        "fast_byte_level_encode_decode": len(held) / ours_bl_s,
        "fast_encode_decode": len(held) / ours_s,
        "fast_encode": len(held) / enc_s,
        "fast_decode": len(held) / dec_s,
        "speedup_byte_level_vs_reference": ref_s / ours_bl_s,
        "speedup_vs_reference": ref_s / ours_s,
    }

    # --- quality: every tokenizer on the same held-out chunks ---------------------------------------------
    start = time.perf_counter()
    fsq = at.FSQTokenizer.fit(train, steps=args.fsq_steps)
    fsq_fit_s = time.perf_counter() - start
    toks = {"fast": char, "fast-bytelevel": tok, "bin": at.BinningTokenizer.fit(train), "fsq": fsq}
    results["tokenizers"] = {name: quality(k, held) for name, k in toks.items()}
    results["tokenizers"]["fsq"]["fit_seconds"] = fsq_fit_s
    results["data_std"] = float(held.std())

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["throughput_chunks_per_s"], indent=2))
    print("| tokenizer | vocab | tokens/chunk | compression | RMSE | max abs | invalid chunks |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results["tokenizers"].items():
        print(
            f"| {name} | {r['vocab_size']} | {r['tokens_per_chunk_mean']:.1f} | {r['compression']:.2f} | "
            f"{r['rmse']:.4f} | {r['max_abs']:.3f} | {r['invalid_chunks']} |"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
