#!/usr/bin/env python
"""Rate-distortion curves of FAST variants against the published FAST, on held-out episodes of real and simulated
datasets: tokens per chunk against RMSE (normalised units), and tokens at equal RMSE.

    python scripts/rate_distortion.py --out results/rate_distortion \\
        --dataset piper_grape=../shared/data/real/piper_grape --dataset mw_push=outputs/datasets/metaworld_push-v3 ...

Protocol (as a new user would run it): episodes split 80/20 (seed 0); q01/q99 of the training episodes' frames
normalise to [-1, 1]; one chunk per frame (stride 1) of ``T`` = 1 s (``fps`` steps, capped at the shortest episode
like ``vla compare``); every tokenizer is fitted on the training chunks and measured on the held-out chunks.
"Published" is the published algorithm: ``FASTTokenizer(byte_level=True)``, whose ids are checked here against
``action_tokenizers.reference`` (the per-chunk transcription) at scale 10. All curves are measured on the held-out
chunks the published tokenizer decodes at every scale (the others decode all of them); the count left out is
reported. "Tokens at equal RMSE" interpolates a curve log-log at the published point's RMSE.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import action_tokenizers as at  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from action_tokenizers import reference  # noqa: E402
from action_tokenizers.coefficients import flatten, ints_to_strings  # noqa: E402

from vla.data.columns import action_chunks
from vla.data.reader import dataset_info, split_episodes  # noqa: E402
from vla.data.stats import frame_stats  # noqa: E402
from vla.io import save_figure  # noqa: E402

SCALES = [2.0, 3.0, 5.0, 7.0, 10.0, 14.0, 20.0, 28.0, 40.0]
COMPARE_AT = [5.0, 10.0, 20.0]  # the published points the comparison is read at
# label -> FASTTokenizer.fit options (scale swept). The vocabulary is the published rule's (vocab_size None: 1,024 ids
# on these datasets) throughout, as when results/rate_distortion was measured; FAST now chooses it from the data.
VARIANTS = {
    "published (byte-level BPE, frequency-major)": {"byte_level": True},
    "char-level, frequency-major, longest match": {"order": "frequency", "deadzone": 0.0, "vocab_size": None},
    "char-level, frequency-major, deadzone 0.2": {"order": "frequency", "deadzone": 0.2, "vocab_size": None},
    "char-level, dimension-major": {"order": "dimension", "deadzone": 0.0, "vocab_size": None},
    "char-level, dimension-major, deadzone 0.2 (new default)": {"vocab_size": None},
    "new default, vocab 2048": {"vocab_size": 2048},
}
PUBLISHED = next(iter(VARIANTS))
DEFAULT = "char-level, dimension-major, deadzone 0.2 (new default)"
FREQUENCY = "char-level, frequency-major, longest match"
PREVIOUS = "previous default: char-level, frequency-major, replaying merges"
MERGES = "new default, encoded by replaying the BPE merges (not longest match)"
BEAST_POINTS = [3, 4, 5, 6, 8, 10, 12]  # control points (degree min(4, N - 1), 256 bins)


def load(root: Path, time_horizon: int | None) -> tuple[np.ndarray, np.ndarray, int, dict]:
    info = dataset_info(root)
    t = time_horizon or min(int(round(info.fps)), int(info.episode_lengths.min()))
    train_eps, held_eps = split_episodes(root, heldout=0.2, seed=0)
    norm = at.Normalizer.from_stats(frame_stats(root, ["action"], episodes=train_eps)["action"], "quantile")
    train = norm.normalize(action_chunks(root, t, episodes=train_eps)[0])
    held = norm.normalize(action_chunks(root, t, episodes=held_eps)[0])
    meta = {
        "fps": float(info.fps),
        "episodes": int(info.num_episodes),
        "train_episodes": len(train_eps),
        "heldout_episodes": len(held_eps),
        "train_chunks": len(train),
        "heldout_chunks": len(held),
    }
    return train, held, t, meta


def measure(tok: at.ActionTokenizer, held: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per held-out chunk: tokens, squared error summed over the chunk, valid, and (character-level FAST) the
    tokens the BPE would spell by replaying its merges instead of the longest match (the same coefficients)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # byte-level drops: counted through `valid`
        ids = tok.encode(held)
    out = tok.decode(ids, time_horizon=held.shape[1], action_dim=held.shape[2])
    sq = np.where(out.valid[:, None, None], out.actions - held, 0.0) ** 2
    tokens = np.array([len(r) for r in ids])
    merges = tokens
    if isinstance(tok, at.FASTTokenizer) and not tok.byte_level:
        symbols = np.clip(flatten(tok.coefficients(held) - tok.min_token, tok.order), 0, tok.n_symbols - 1)
        merges = np.array([len(e.ids) for e in tok.bpe.encode_batch_fast(ints_to_strings(symbols))])
    return tokens, sq.sum(axis=(1, 2)), out.valid, merges


def tokens_at(curve: list[dict], rmse: float) -> float:
    """Tokens of ``curve`` at ``rmse``: log-log interpolation on its Pareto front (nan outside its range)."""
    pts = sorted((p["rmse"], p["tokens"]) for p in curve)
    front, best = [], np.inf
    for r, t in pts:  # keep points no point with lower RMSE beats on tokens
        if t < best:
            front.append((r, t))
            best = t
    r, t = np.log([p[0] for p in front]), np.log([p[1] for p in front])
    if not r[0] <= np.log(rmse) <= r[-1]:
        return float("nan")
    return float(np.exp(np.interp(np.log(rmse), r, t)))


def run_dataset(name: str, root: Path, time_horizon: int | None) -> dict:
    train, held, t, meta = load(root, time_horizon)
    d = held.shape[2]
    print(f"{name}: T={t} D={d}, {len(train)} train / {len(held)} held-out chunks", flush=True)
    raw: dict[str, list] = {}
    for label, options in VARIANTS.items():
        raw[label] = []
        for scale in SCALES:
            start = time.perf_counter()
            tok = at.FASTTokenizer.fit(train, scale=scale, **options)
            fit_s = time.perf_counter() - start
            raw[label].append((scale, tok.vocab_size, fit_s, *measure(tok, held)))
            if label == PUBLISHED and scale == 10.0:  # the published algorithm, chunk by chunk, gives the same ids
                bpe, min_token = reference.fit(list(train), scale=scale, vocab_size=tok.vocab_size)
                sample = held[:: max(1, len(held) // 500)]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    same = np.mean(
                        [a == b for a, b in zip(tok.encode(sample), reference.encode(bpe, sample, scale, min_token))]
                    )
                meta["published_ids_equal_reference_loop"] = float(same)
        print(f"  {label}: done", flush=True)
    both = np.logical_and.reduce([p[5] for p in raw[PUBLISHED]])  # chunks the published decodes at every scale
    curves: dict[str, list[dict]] = {}
    for label, points in raw.items():
        curves[label] = [
            {
                "scale": s,
                "vocab_size": v,
                "fit_s": round(f, 2),
                "tokens": float(n[both].mean()),
                "rmse": float(np.sqrt(sq[both].sum() / (both.sum() * t * d))),
                "valid_rate": float(ok.mean()),
                "tokens_replaying_merges": float(m[both].mean()),
            }
            for s, v, f, n, sq, ok, m in points
        ]
    curves[MERGES] = [{**p, "tokens": p["tokens_replaying_merges"]} for p in curves[DEFAULT]]
    curves[PREVIOUS] = [{**p, "tokens": p["tokens_replaying_merges"]} for p in curves[FREQUENCY]]
    curves["BEAST (256 bins)"] = []
    for n_cp in BEAST_POINTS:
        if n_cp > t:
            continue
        tok = at.BEASTTokenizer.fit(train, n_control_points=n_cp, degree=min(4, n_cp - 1))
        n, sq, ok, _ = measure(tok, held)
        curves["BEAST (256 bins)"].append(
            {
                "n_control_points": n_cp,
                "tokens": float(n[both].mean()),
                "rmse": float(np.sqrt(sq[both].sum() / (both.sum() * t * d))),
                "valid_rate": float(ok.mean()),
            }
        )
    published = {p["scale"]: p for p in curves[PUBLISHED]}
    comparison = {}
    for label, curve in curves.items():
        if label == PUBLISHED:
            continue
        row = {}
        for s in COMPARE_AT:
            p = published[s]
            ours = tokens_at(curve, p["rmse"])
            envelope = tokens_at(curves[PUBLISHED], p["rmse"])
            row[f"scale {s:g}"] = {
                "published_tokens": p["tokens"],
                "rmse": p["rmse"],
                "tokens": ours,
                "ratio": ours / p["tokens"],
                "ratio_vs_published_front": ours / envelope,
            }
        comparison[label] = row
    meta.update(
        time_horizon=t,
        action_dim=d,
        heldout_chunks_compared=int(both.sum()),
        heldout_chunks_published_cannot_decode=int((~both).sum()),
    )
    return {"dataset": str(root), **meta, "curves": curves, "equal_rmse": comparison}


def plot(results: dict, path: Path) -> None:
    names = list(results)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    styles = {PUBLISHED: dict(color="black", lw=2.2, marker="o"), DEFAULT: dict(color="tab:red", lw=2.2, marker="s")}
    for ax, name in zip(axes.flat, names):
        r = results[name]
        for label, curve in r["curves"].items():
            style = styles.get(label, dict(lw=1, marker=".", alpha=0.8))
            ax.plot([p["rmse"] for p in curve], [p["tokens"] for p in curve], label=label, **style)
        for s in COMPARE_AT:
            p = next(p for p in r["curves"][PUBLISHED] if p["scale"] == s)
            ax.annotate(f"s={s:g}", (p["rmse"], p["tokens"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("held-out RMSE (normalised units)")
        ax.set_ylabel("tokens per chunk")
        ax.set_title(f"{name} (T={r['time_horizon']}, D={r['action_dim']})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6.5, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def markdown(results: dict) -> str:
    lines = [
        "# Rate-distortion: FAST variants against the published FAST",
        "",
        "Written by `scripts/rate_distortion.py` (protocol in its docstring). Tokens per held-out chunk at the RMSE",
        "of the published algorithm's points at scales 5 / 10 / 20 (log-log interpolation on each curve).",
        "`ratio` < 1: fewer tokens than the published point; `vs front`: against the published curve's Pareto front",
        "interpolated at that RMSE (its points are not monotone: past 127 symbols a coefficient takes two UTF-8 bytes).",
        "",
        "| dataset | T x D | held-out chunks | published at s=5 / 10 / 20 (tokens @ RMSE) | new default: tokens | ratio | vs front |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        c = r["equal_rmse"][DEFAULT]
        pub = " / ".join(f"{v['published_tokens']:.1f} @ {v['rmse']:.4f}" for v in c.values())
        ours = " / ".join(f"{v['tokens']:.1f}" for v in c.values())
        ratio = " / ".join(f"{v['ratio']:.2f}" for v in c.values())
        front = " / ".join(f"{v['ratio_vs_published_front']:.2f}" for v in c.values())
        lines.append(
            f"| {name} | {r['time_horizon']} x {r['action_dim']} | {r['heldout_chunks_compared']} "
            f"(+{r['heldout_chunks_published_cannot_decode']} published cannot decode) | {pub} | {ours} | {ratio} | {front} |"
        )
    lines += ["", "## Every variant: tokens at equal RMSE / published (scales 5 / 10 / 20)", ""]
    labels = list(next(iter(results.values()))["equal_rmse"])
    lines += ["| variant | " + " | ".join(results) + " |", "| --- |" + " --- |" * len(results)]
    for label in labels:
        cells = []
        for r in results.values():
            c = r["equal_rmse"][label]
            cells.append(" / ".join("-" if np.isnan(v["ratio"]) else f"{v['ratio']:.2f}" for v in c.values()))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "![rate-distortion](rate_distortion.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", action="append", default=[], help="NAME=PATH[:T] (T: chunk length)")
    parser.add_argument("--out", type=Path, default=Path("results/rate_distortion"))
    parser.add_argument("--replot", action="store_true", help="redraw the PNG and table from the existing JSON")
    args = parser.parse_args()
    if args.replot:
        results = json.loads((args.out / "rate_distortion.json").read_text())
        plot(results, args.out / "rate_distortion.png")
        (args.out / "README.md").write_text(markdown(results))
        return
    if not args.dataset:
        parser.error("pass at least one --dataset NAME=PATH[:T] (or --replot)")
    results = {}
    for spec in args.dataset:
        name, _, rest = spec.partition("=")
        path, _, t = rest.partition(":")
        results[name] = run_dataset(name, Path(path), int(t) if t else None)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rate_distortion.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "rate_distortion.png")
    (args.out / "README.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
