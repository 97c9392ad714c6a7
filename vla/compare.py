"""``vla compare``: which action tokenizer, at which setting, for this robot's data?

Fit every tokenizer on the training episodes' chunks, measure on the held-out episodes' chunks:

    chunks (raw) --quantile normaliser fitted on train--> normalised --tok.encode--> ids --tok.decode--> chunks

Per tokenizer: tokens per chunk, compression against naive binning (``T x D / mean tokens``), reconstruction
error in normalised and raw units (overall and per dimension), the share of chunks whose worst error exceeds a
tolerance, encode/decode throughput, vocabulary use, and how often random, corrupted and constrained id
sequences decode. ``--sweep`` adds rate-distortion curves. Writes ``compare.json``, ``compare.md`` and PNG plots.
"""

from __future__ import annotations

import argparse
import difflib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

import action_tokenizers as at
from vla import data

def _fit_fast(chunks: np.ndarray, byte_level: bool = False, **options: Any) -> at.FASTTokenizer:
    options.setdefault("vocab_size", fast_vocab(chunks, options.get("scale", 10.0)))
    return at.FASTTokenizer.fit(chunks, byte_level=byte_level, **options)


# name -> how to fit it on normalised training chunks (options override the defaults)
FITTERS: dict[str, Callable[..., at.ActionTokenizer]] = {
    "fast": _fit_fast,
    "fast-bytelevel": lambda chunks, **options: _fit_fast(chunks, byte_level=True, **options),
    "bin": at.BinningTokenizer.fit,
    "fsq": at.FSQTokenizer.fit,
}
DEFAULT_TOKENIZERS = ("fast", "fast-bytelevel", "bin", "fsq")
SWEEPS: dict[str, tuple[str, str, list[Any]]] = {  # tokenizer -> (option, label, values)
    "fast": ("scale", "scale", [2.0, 5.0, 10.0, 20.0, 50.0]),
    "bin": ("n_bins", "bins", [32, 64, 128, 256, 512, 1024]),
    "fsq": ("levels", "levels", [[8, 6, 5], [8, 5, 5, 5], [7, 5, 5, 5, 5], [8, 8, 8, 6, 5], [8, 8, 8, 5, 5, 5]]),
}


def fast_vocab(chunks: np.ndarray, scale: float, default: int = 1024) -> int:
    """FAST's default vocabulary, raised when the coefficient range needs more symbols than it has."""
    q = np.around(at.fast.dct(chunks) * scale)
    n_symbols = int(q.max() - q.min() + 1)
    return max(default, int(2 ** np.ceil(np.log2(n_symbols + 256))))


def parse_tokenizers(names: str | list[str]) -> list[str]:
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    for name in names:
        if name not in FITTERS:
            close = difflib.get_close_matches(name, FITTERS, n=1, cutoff=0.4)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown tokenizer {name!r}{hint} (known: {', '.join(FITTERS)})")
    if not names:
        raise ValueError("no tokenizers to compare; pass e.g. --tokenizers fast,bin")
    return names


def default_time_horizon(info: data.DatasetInfo, log: Callable[[str], None] = print) -> int:
    """One second of data, capped at the shortest episode (with a message)."""
    horizon = max(1, int(round(info.fps)))
    shortest = int(info.episode_lengths.min())
    if horizon > shortest:
        log(f"time horizon {horizon} (1 s at {info.fps} fps) is longer than the shortest episode; using {shortest}")
        horizon = shortest
    return horizon


@dataclass
class Split:
    train: np.ndarray  # normalised [N, T, D]
    heldout: np.ndarray  # normalised [M, T, D]
    heldout_raw: np.ndarray  # raw units [M, T, D]
    normalizer: at.Normalizer
    time_horizon: int
    train_episodes: list[int]
    heldout_episodes: list[int]


def load_split(root: Path, time_horizon: int | None, heldout: float, seed: int, log=print) -> Split:
    info = data.dataset_info(root)
    if time_horizon is None:
        time_horizon = default_time_horizon(info, log)
    elif time_horizon > int(info.episode_lengths.max()):
        raise ValueError(
            f"time horizon {time_horizon} is longer than every episode (longest {int(info.episode_lengths.max())}); "
            "pass a smaller --time-horizon"
        )
    train_eps, held_eps = data.split_episodes(root, heldout=heldout, seed=seed)
    if not held_eps:
        raise ValueError("the held-out share is 0; pass --episodes-heldout between 0 and 1 (e.g. 0.2)")
    train_raw, _ = data.action_chunks(root, time_horizon, episodes=train_eps)
    held_raw, _ = data.action_chunks(root, time_horizon, episodes=held_eps)
    normalizer = at.Normalizer.fit(train_raw[:, 0, :], "quantile")  # every training frame's action once
    return Split(
        train=normalizer.normalize(train_raw),
        heldout=normalizer.normalize(held_raw),
        heldout_raw=held_raw.astype(np.float64),
        normalizer=normalizer,
        time_horizon=time_horizon,
        train_episodes=train_eps,
        heldout_episodes=held_eps,
    )


# --- measurements ------------------------------------------------------------------------------------------
def _rate(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    fn()
    return n / max(time.perf_counter() - start, 1e-9)


def error_stats(pred: np.ndarray, true: np.ndarray) -> dict[str, Any]:
    err = pred - true
    return {
        "mae": float(np.abs(err).mean()),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "max_abs": float(np.abs(err).max()),
        "rmse_per_dim": np.sqrt(np.mean(err**2, axis=(0, 1))).tolist(),
        "mae_per_dim": np.abs(err).mean(axis=(0, 1)).tolist(),
    }


def corrupt(rows: list[list[int]], vocab_size: int, rng: np.random.Generator) -> list[list[int]]:
    """One random edit per sequence: substitute, delete or insert an id (what a model's slip looks like)."""
    out = []
    for row in rows:
        row = list(row)
        kind, pos = rng.integers(3), int(rng.integers(len(row)))
        if kind == 0:
            row[pos] = int(rng.integers(vocab_size))
        elif kind == 1 and len(row) > 1:
            del row[pos]
        else:
            row.insert(pos, int(rng.integers(vocab_size)))
        out.append(row)
    return out


def constrained_walks(tok: at.ActionTokenizer, t: int, d: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """Sequences sampled uniformly among the allowed ids at every step (the worst a policy could do)."""
    c = tok.constraint(time_horizon=t, action_dim=d)
    rows = []
    for _ in range(n):
        state, ids = c.start(), []
        while not c.done(state):
            choice = int(rng.choice(np.flatnonzero(c.allowed(state))))
            ids.append(choice)
            state = c.advance(state, choice)
        rows.append(ids)
    return rows


def measure(tok: at.ActionTokenizer, split: Split, tolerance: float, n_random: int, seed: int) -> dict[str, Any]:
    held, (m, t, d) = split.heldout, split.heldout.shape
    rng = np.random.default_rng(seed)
    ids = tok.encode(held)
    encode_rate = _rate(lambda: tok.encode(held), m)
    decode_rate = _rate(lambda: tok.decode(ids, time_horizon=t, action_dim=d), m)
    out = tok.decode(ids, time_horizon=t, action_dim=d)
    lengths = np.array([len(r) for r in ids])
    ok = out.valid  # byte-level FAST can drop a value never seen at fit time: that chunk is NaN, counted apart
    norm_err = error_stats(out.actions[ok], held[ok])
    raw_err = error_stats(split.normalizer.unnormalize(out.actions[ok]), split.heldout_raw[ok])
    worst = np.where(ok, np.abs(out.actions - held).max(axis=(1, 2)), np.inf)  # [M]; an invalid chunk counts as over
    used = np.unique(np.concatenate([np.asarray(r, dtype=np.int64) for r in ids]))

    # Decodability: random ids of realistic lengths, real ids with one edit, and constrained walks.
    sample = rng.choice(m, size=min(n_random, m), replace=False)
    random_rows = [rng.integers(0, tok.vocab_size, int(rng.choice(lengths))).tolist() for _ in sample]
    corrupted = corrupt([ids[i] for i in sample], tok.vocab_size, rng)
    corrupted_out = tok.decode(corrupted, time_horizon=t, action_dim=d, mode="repair")
    constrained = tok.decode(constrained_walks(tok, t, d, len(sample), rng), time_horizon=t, action_dim=d)
    return {
        "vocab_size": tok.vocab_size,
        "tokens_per_chunk_mean": float(lengths.mean()),
        "tokens_per_chunk_p50": float(np.percentile(lengths, 50)),
        "tokens_per_chunk_p99": float(np.percentile(lengths, 99)),
        "tokens_per_chunk_max": int(lengths.max()),
        "compression": float(t * d / lengths.mean()),
        **{k: v for k, v in norm_err.items()},
        "raw": raw_err,
        "share_max_error_above_tol": float(np.mean(worst > tolerance)),
        "encode_chunks_per_s": encode_rate,
        "decode_chunks_per_s": decode_rate,
        "vocab_used": float(len(used) / tok.vocab_size),
        "valid_rate_heldout": float(out.valid.mean()),
        "clipped_rate": tok.encode_stats.clipped_rate,
        "valid_rate_random": float(tok.decode(random_rows, time_horizon=t, action_dim=d).valid.mean()),
        "valid_rate_corrupted": float(corrupted_out.valid.mean()),
        "valid_rate_repair": float(np.isfinite(corrupted_out.actions).all(axis=(1, 2)).mean()),
        "repair_rmse_corrupted": float(np.sqrt(np.mean((corrupted_out.actions - held[sample]) ** 2))),
        "valid_rate_constrained": float(constrained.valid.mean()),
        "token_lengths": np.bincount(lengths).tolist(),
    }


def sweep(split: Split, names: list[str], fit_options: dict[str, dict], log=print) -> dict[str, list[dict]]:
    """Rate-distortion: tokens per chunk against RMSE (normalised units) over each tokenizer's main knob."""
    curves: dict[str, list[dict]] = {}
    todo = [(n, v) for n in names if n in SWEEPS for v in SWEEPS[n][2]]
    for name, value in tqdm(todo, desc="sweep"):
        option, label, _ = SWEEPS[name]
        tok = FITTERS[name](split.train, **{**fit_options.get(name, {}), option: value})
        ids = tok.encode(split.heldout)
        out = tok.decode(ids, time_horizon=split.time_horizon, action_dim=split.heldout.shape[2])
        curves.setdefault(name, []).append(
            {
                label: value,
                "vocab_size": tok.vocab_size,
                "tokens_per_chunk_mean": float(np.mean([len(r) for r in ids])),
                "rmse": float(np.sqrt(np.mean((out.actions - split.heldout) ** 2))),
            }
        )
    return curves


def compare(
    root: str | Path,
    out_dir: str | Path,
    tokenizers: str | list[str] = DEFAULT_TOKENIZERS,
    time_horizon: int | None = None,
    heldout: float = 0.2,
    do_sweep: bool = False,
    tolerance: float = 0.1,
    n_random: int = 1000,
    seed: int = 0,
    fit_options: dict[str, dict] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    names = parse_tokenizers(tokenizers)
    fit_options = fit_options or {}
    root, out_dir = Path(root), Path(out_dir)
    split = load_split(root, time_horizon, heldout, seed, log)
    t, d = split.time_horizon, split.heldout.shape[2]
    log(f"{len(split.train)} training chunks ({len(split.train_episodes)} episodes), {len(split.heldout)} held-out "
        f"chunks ({len(split.heldout_episodes)} episodes), T={t}, D={d}")  # fmt: skip
    results: dict[str, Any] = {
        "dataset": str(root),
        "time_horizon": t,
        "action_dim": d,
        "n_train_chunks": len(split.train),
        "n_heldout_chunks": len(split.heldout),
        "tolerance": tolerance,
        "heldout_std": float(split.heldout.std()),
        "tokenizers": {},
    }
    bar = tqdm(names, desc="fit + measure")
    for name in bar:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        tok = FITTERS[name](split.train, **fit_options.get(name, {}))
        fit_s = time.perf_counter() - start
        results["tokenizers"][name] = {"fit_seconds": fit_s, **measure(tok, split, tolerance, n_random, seed)}
    if do_sweep:
        results["sweep"] = sweep(split, names, fit_options, log)
    write_outputs(results, out_dir)
    log(markdown_table(results))
    return results


# --- outputs -----------------------------------------------------------------------------------------------
def markdown_table(results: dict[str, Any]) -> str:
    head = (
        f"T={results['time_horizon']}, D={results['action_dim']}, {results['n_heldout_chunks']} held-out chunks "
        f"(error in normalised units; tolerance {results['tolerance']})\n\n"
        "| tokenizer | vocab | tokens/chunk (mean / p99 / max) | compression | RMSE | MAE | max abs | "
        "share > tol | encode /s | decode /s | vocab used | valid random | valid corrupted | valid constrained |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    for name, r in results["tokenizers"].items():
        rows.append(
            f"| {name} | {r['vocab_size']} | {r['tokens_per_chunk_mean']:.1f} / {r['tokens_per_chunk_p99']:.0f} / "
            f"{r['tokens_per_chunk_max']} | {r['compression']:.2f}x | {r['rmse']:.4f} | {r['mae']:.4f} | "
            f"{r['max_abs']:.3f} | {r['share_max_error_above_tol']:.3f} | {r['encode_chunks_per_s']:,.0f} | "
            f"{r['decode_chunks_per_s']:,.0f} | {r['vocab_used']:.2f} | {r['valid_rate_random']:.2f} | "
            f"{r['valid_rate_corrupted']:.2f} | {r['valid_rate_constrained']:.2f} |"
        )
    return head + "\n".join(rows) + "\n"


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    at.base.atomic_write_text(out_dir / "compare.json", json.dumps(results, indent=2) + "\n")
    at.base.atomic_write_text(out_dir / "compare.md", markdown_table(results))
    toks = results["tokenizers"]

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in toks.items():
        ax.scatter(r["tokens_per_chunk_mean"], r["rmse"], label=name, zorder=3)
    for name, points in results.get("sweep", {}).items():
        ax.plot([p["tokens_per_chunk_mean"] for p in points], [p["rmse"] for p in points], "-o", ms=3, label=f"{name} sweep")
    ax.set(xlabel="tokens per chunk (mean)", ylabel="RMSE (normalised)", xscale="log", yscale="log",
           title="rate-distortion on held-out chunks")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "rate_distortion.png", dpi=120)

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(len(toks), 1)
    for k, (name, r) in enumerate(toks.items()):
        per_dim = r["rmse_per_dim"]
        ax.bar(np.arange(len(per_dim)) + k * width, per_dim, width, label=name)
    ax.set(xlabel="action dimension", ylabel="RMSE (normalised)", title="error per dimension")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "per_dim_error.png", dpi=120)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in toks.items():
        counts = np.asarray(r["token_lengths"], dtype=float)
        ax.step(np.arange(len(counts)), counts / counts.sum(), where="mid", label=name)
    ax.set(xlabel="tokens per chunk", ylabel="share of chunks", title="token-length histogram")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "token_lengths.png", dpi=120)
    plt.close("all")


# --- CLI ---------------------------------------------------------------------------------------------------
def add_cli(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare action tokenizers on a dataset", description=__doc__)
    p.add_argument("--root", type=Path, required=True, help="a local LeRobot v3.0 dataset")
    p.add_argument("--out", type=Path, required=True, help="folder for compare.json, compare.md and the plots")
    p.add_argument("--tokenizers", default=",".join(DEFAULT_TOKENIZERS), help="comma-separated: " + ", ".join(FITTERS))
    p.add_argument("--time-horizon", type=int, default=None, help="T; default one second, capped at the shortest episode")
    p.add_argument("--episodes-heldout", type=float, default=0.2, help="share of episodes held out for measuring")
    p.add_argument("--sweep", action="store_true", help="also sweep FAST scale, bin count and FSQ levels")
    p.add_argument("--tolerance", type=float, default=0.1, help="max-error threshold (normalised units)")
    p.add_argument("--fsq-steps", type=int, default=3000, help="FSQ training steps")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    compare(
        args.root,
        args.out,
        tokenizers=args.tokenizers,
        time_horizon=args.time_horizon,
        heldout=args.episodes_heldout,
        do_sweep=args.sweep,
        tolerance=args.tolerance,
        seed=args.seed,
        fit_options={"fsq": {"steps": args.fsq_steps}},
    )
    print(f"wrote {args.out / 'compare.json'}, compare.md and plots")
    return 0
