"""``vla compare``: which action tokenizer, at which setting, for this robot's data?

Fit every tokenizer on the training episodes' chunks, measure on the held-out episodes' chunks:

    chunks (raw) --quantile normaliser fitted on train--> normalised --tok.encode--> ids --tok.decode--> chunks

Per tokenizer: tokens per chunk, compression against naive binning (``T x D / mean tokens``), reconstruction
error in normalised and raw units (overall and per dimension), the share of chunks whose worst error exceeds a
tolerance, encode/decode throughput, vocabulary use, and how often random, corrupted and constrained id
sequences decode. ``--sweep`` adds rate-distortion curves. Writes ``compare.json``, ``compare.md`` and PNG plots
into a new folder (an existing one is refused unless ``--overwrite``), and ends with a recommendation: the tokenizer
that spells a chunk in the fewest ids while every held-out chunk decodes within ``--max-rmse``, measured at the
chunk length ``vla train`` would choose for the dataset (``vla.data.defaults``), with the ``vla train`` flags to use.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import action_tokenizers as at
import numpy as np
from lerobot.utils.constants import ACTION
from tqdm.auto import tqdm

from vla.compare_report import markdown_table, recommendation_text, write_outputs
from vla.data import columns, reader
from vla.io import atomic_directory
from vla.policy.pipeline import ACTION_IDS, DetokenizeActions, Normalize, Unnormalize, run
from vla.provenance import provenance
from vla.tokenizer_choice import TokenizerConfig, parse_choice, tokenizer_config

# The comparison's default entries: every registered tokenizer, plus FAST with the published byte-level BPE.
DEFAULT_TOKENIZERS = ("fast", "fast:byte_level=true", *(n for n in at.TOKENIZERS if n != "fast"))
SWEEPS: dict[str, tuple[str, list[Any]]] = {  # tokenizer -> (option, values): its rate-distortion knob
    "fast": ("scale", [2.0, 5.0, 10.0, 20.0, 50.0]),
    "bin": ("n_bins", [32, 64, 128, 256, 512, 1024]),
    "fsq": ("levels", [[8, 6, 5], [8, 5, 5, 5], [7, 5, 5, 5, 5], [8, 8, 8, 6, 5], [8, 8, 8, 5, 5, 5]]),
    "beast": ("n_control_points", [5, 6, 8, 10, 14]),  # degree 4 needs at least 5
}
# FSQ trains an autoencoder: at its own default (3000 steps) its fit was 205-234 s of a 215-247 s comparison, so
# compare fits it shorter (200 steps, at most 15 s) unless the entry or --fsq-steps / --fsq-max-seconds names them
# (vla train fits it in full); the recommendation says its error is then an upper bound.
FSQ_STEPS = 200
FSQ_SECONDS = 15.0
# The recommendation's error bound (RMSE in normalised units, where q01..q99 spans [-1, 1]): 2.5% of that range.
MAX_RMSE = 0.05


@dataclass(frozen=True)
class Entry:
    """One row of the comparison: a tokenizer choice, written ``name[:option=value,...]``
    (``vla.tokenizer_choice.parse_choice``)."""

    label: str  # as written, e.g. "fast:byte_level=true"
    choice: TokenizerConfig

    @property
    def name(self) -> str:  # the registry name
        return self.choice.type

    def fit(self, chunks: np.ndarray, **extra: Any) -> at.ActionTokenizer:
        return self.choice.fit(chunks, **extra)


def parse_entry(spec: str) -> Entry:
    """``"bin:n_bins=128"`` -> ``Entry("bin:n_bins=128", the bin choice with n_bins=128)``."""
    return Entry(spec.strip(), parse_choice(spec))


def parse_tokenizers(specs: str | list[str]) -> list[Entry]:
    specs = specs.split() if isinstance(specs, str) else list(specs)  # entries are separated by spaces
    if not specs:
        raise ValueError("no tokenizers to compare; pass e.g. --tokenizers 'fast bin'")
    return [parse_entry(s) for s in specs]


def default_time_horizon(info: reader.DatasetInfo, log: Callable[[str], None] = print) -> int:
    """The chunk length ``vla train --dataset_root DIR`` would choose (``vla.data.defaults.choose``, the same rule,
    not a copy: ``CHUNK_SECONDS`` at the dataset's fps, cut to the longest episode), printed with its reason."""
    return _chosen_time_horizon(info, log)[0]


def _chosen_time_horizon(info: reader.DatasetInfo, log: Callable[[str], None] | None = print) -> tuple[int, str]:
    """(T, why) as ``vla train`` chooses it with nothing given."""
    from vla.config import load_config
    from vla.data import defaults

    cfg = load_config(args=[f"--dataset_root={info.root}"], log=None)  # vla train --dataset_root DIR: all chosen
    # the chunk only: a policy without state skips matching the state (which reads frames), and the chunk rule
    # does not depend on it
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, state_dim=0, relative_actions="none"))
    _, choices = defaults.choose(cfg, info)
    choice = next(c for c in choices if c.name == "policy.time_horizon")
    if log is not None:
        log(f"time horizon {choice.value}: {choice.why}, as vla train chooses it")
    return int(choice.value), choice.why


@dataclass
class Split:
    train: np.ndarray  # normalised [N, T, D]
    heldout: np.ndarray  # normalised [M, T, D]
    heldout_raw: np.ndarray  # raw units [M, T, D]
    normalizer: at.Normalizer
    time_horizon: int
    train_episodes: list[int]
    heldout_episodes: list[int]
    fps: float = 0.0  # the dataset's frames per second
    time_horizon_why: str = ""  # where T came from: given, or chosen as vla train chooses it


def load_split(root: Path, time_horizon: int | None, heldout: float, seed: int, log=print) -> Split:
    info = reader.dataset_info(root)
    why = "given by --time-horizon"
    if time_horizon is None:
        time_horizon = _chosen_time_horizon(info, log)[0]
        why = "the chunk vla train chooses"
    elif time_horizon > int(info.episode_lengths.max()):
        raise ValueError(
            f"time horizon {time_horizon} is longer than every episode (longest {int(info.episode_lengths.max())}); "
            "pass a smaller --time-horizon"
        )
    train_eps, held_eps = reader.split_episodes(info, heldout=heldout, seed=seed)
    if not held_eps:
        raise ValueError("the held-out share is 0; pass --episodes-heldout between 0 and 1 (e.g. 0.2)")
    train_raw, _ = columns.action_chunks(info, time_horizon, episodes=train_eps)
    held_raw, _ = columns.action_chunks(info, time_horizon, episodes=held_eps)
    normalizer = at.Normalizer.fit(train_raw[:, 0, :], "quantile")  # every training frame's action once
    normalize = Normalize(None, normalizer)  # the policy pipeline's own step
    return Split(
        train=normalize({ACTION: train_raw})[ACTION],
        heldout=normalize({ACTION: held_raw})[ACTION],
        heldout_raw=held_raw.astype(np.float64),
        normalizer=normalizer,
        time_horizon=time_horizon,
        train_episodes=train_eps,
        heldout_episodes=held_eps,
        fps=float(info.fps),
        time_horizon_why=why,
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
    # ids -> normalised -> raw chunks through the policy pipeline's output steps
    out = run([DetokenizeActions(tok, t, d)], {ACTION_IDS: ids})
    raw = Unnormalize(split.normalizer)(out)[ACTION]
    lengths = np.array([len(r) for r in ids])
    ok = out["valid"]  # byte-level FAST can drop a value never seen at fit time: that chunk is NaN, counted apart
    norm_err = error_stats(out[ACTION][ok], held[ok])
    raw_err = error_stats(raw[ok], split.heldout_raw[ok])
    worst = np.where(
        ok, np.abs(np.nan_to_num(out[ACTION]) - held).max(axis=(1, 2)), np.inf
    )  # [M]; an invalid chunk counts as over
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
        "valid_rate_heldout": float(ok.mean()),
        "clipped_rate": tok.encode_stats.clipped_rate,
        "valid_rate_random": float(tok.decode(random_rows, time_horizon=t, action_dim=d).valid.mean()),
        "valid_rate_corrupted": float(corrupted_out.valid.mean()),
        "valid_rate_repair": float(np.isfinite(corrupted_out.actions).all(axis=(1, 2)).mean()),
        "repair_rmse_corrupted": float(np.sqrt(np.mean((corrupted_out.actions - held[sample]) ** 2))),
        "valid_rate_constrained": float(constrained.valid.mean()),
        "token_lengths": np.bincount(lengths).tolist(),
    }


def sweep(split: Split, entries: list[Entry], fit_options: dict[str, dict], log=print) -> dict[str, list[dict]]:
    """Rate-distortion: tokens per chunk against RMSE (normalised units) over each tokenizer's main knob."""
    curves: dict[str, list[dict]] = {}
    todo = [(e, v) for e in entries if e.name in SWEEPS for v in SWEEPS[e.name][1]]
    # a spline cannot have more control points than the chunk has steps
    todo = [(e, v) for e, v in todo if not (e.name == "beast" and v > split.time_horizon)]
    for entry, value in tqdm(todo, desc="sweep"):
        option = SWEEPS[entry.name][0]
        tok = entry.fit(split.train, **{**entry_fit_options(entry, fit_options), option: value})
        ids = tok.encode(split.heldout)
        out = tok.decode(ids, time_horizon=split.time_horizon, action_dim=split.heldout.shape[2])
        curves.setdefault(entry.label, []).append(
            {
                option: value,
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
    max_rmse: float = MAX_RMSE,
    overwrite: bool = False,
) -> dict[str, Any]:
    entries = parse_tokenizers(tokenizers)
    fit_options = fit_options or {}
    root, out_dir = Path(root), Path(out_dir)
    check_out(out_dir, overwrite)  # before any fitting
    if not max_rmse > 0:
        raise ValueError(f"--max-rmse must be > 0 (normalised units), got {max_rmse}; e.g. --max-rmse {MAX_RMSE}")
    split = load_split(root, time_horizon, heldout, seed, log)
    t, d = split.time_horizon, split.heldout.shape[2]
    log(
        f"{len(split.train)} training chunks ({len(split.train_episodes)} episodes), {len(split.heldout)} held-out "
        f"chunks ({len(split.heldout_episodes)} episodes), T={t}, D={d}"
    )
    results: dict[str, Any] = {
        "dataset": str(root),
        "time_horizon": t,
        "time_horizon_why": split.time_horizon_why,
        "fps": split.fps,
        "action_dim": d,
        "n_train_chunks": len(split.train),
        "n_heldout_chunks": len(split.heldout),
        "tolerance": tolerance,
        "max_rmse": max_rmse,
        "heldout_std": float(split.heldout.std()),
        "tokenizers": {},
    }
    bar = tqdm(entries, desc="fit + measure")
    for entry in bar:
        bar.set_postfix_str(entry.label)
        start = time.perf_counter()
        tok = entry.fit(split.train, **entry_fit_options(entry, fit_options))
        fit_s = time.perf_counter() - start
        for line in tok.choices():  # what the fit chose from the chunks (FAST's vocabulary), said and recorded
            log(f"{entry.label}: chose {line}")
        fit_report = {"fit_report": tok.fit_report} if getattr(tok, "fit_report", None) else {}  # FSQ: steps, stop
        chosen = {"chosen": tok.choices()} if tok.choices() else {}
        row = {"fit_seconds": fit_s, **fit_report, **chosen, **measure(tok, split, tolerance, n_random, seed)}
        results["tokenizers"][entry.label] = row
    if do_sweep:
        results["sweep"] = sweep(split, entries, fit_options, log)
    results["recommendation"] = recommend(results, entries)
    settings = dict(
        tokenizers=[e.label for e in entries],
        time_horizon=t,
        heldout=heldout,
        sweep=do_sweep,
        tolerance=tolerance,
        n_random=n_random,
        seed=seed,
        fit_options=fit_options,
        max_rmse=max_rmse,
    )
    results["provenance"] = provenance(config=settings, dataset=root)
    with atomic_directory(out_dir) as tmp:  # the whole folder appears at once, or not at all
        write_outputs(results, tmp)
    log(markdown_table(results))
    log(f"wrote {out_dir}: compare.json, compare.md and plots")
    log(recommendation_text(results))  # the answer, last
    return results


def check_out(out_dir: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that is a file, or a folder that holds files, unless ``overwrite``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file; compare writes a folder (compare.json, compare.md, plots)")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ValueError(f"--out {out_dir} already holds files; choose a new folder, or pass --overwrite to replace it")


def entry_fit_options(entry: Entry, fit_options: dict[str, dict]) -> dict[str, Any]:
    """The fit options on top of ``entry``'s own: ``fit_options[name]``, and for FSQ ``FSQ_STEPS`` and
    ``FSQ_SECONDS`` unless the entry or ``fit_options`` names its steps or its time budget."""
    given = {k: v for k, v in fit_options.get(entry.name, {}).items() if v is not None}
    if entry.name == "fsq":
        named = {*given, *entry_options(entry.label)}
        given |= {k: v for k, v in (("steps", FSQ_STEPS), ("max_seconds", FSQ_SECONDS)) if k not in named}
    return given


def entry_options(label: str) -> list[str]:
    """The option names written in an entry, ``"fsq:steps=900,hidden=64"`` -> ``["steps", "hidden"]``."""
    rest = label.partition(":")[2]
    return [item.partition("=")[0].strip() for item in re.split(r",(?![^\[]*\])", rest) if item.strip()]


def recommend(results: dict[str, Any], entries: list[Entry]) -> dict[str, Any]:
    """The tokenizer to train with: the fewest ids per chunk among the entries whose held-out chunks all decode
    within ``max_rmse`` (ties: the lower RMSE); when none does, the lowest RMSE. Offline only: closed-loop success
    can order them differently (``vla study``)."""
    rows, bound = results["tokenizers"], results["max_rmse"]
    within = [k for k, r in rows.items() if r["valid_rate_heldout"] == 1.0 and r["rmse"] <= bound]
    ranked = sorted(within, key=lambda k: (rows[k]["tokens_per_chunk_mean"], rows[k]["rmse"]))
    pick = ranked[0] if ranked else min(rows, key=lambda k: rows[k]["rmse"])
    entry = next(e for e in entries if e.label == pick)
    defaults = tokenizer_config(entry.name).options()
    flags = [f"--tokenizer.type={entry.name}"] + [
        f"--tokenizer.{k}={_flag_value(v)}" for k, v in entry.choice.options().items() if v != defaults.get(k)
    ]
    return {"tokenizer": pick, "within_bound": bool(ranked), "ranked": ranked, "train_flags": flags}


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


# --- CLI ---------------------------------------------------------------------------------------------------
def add_cli(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare action tokenizers on a dataset", description=__doc__)
    p.add_argument("--root", "--dataset_root", type=Path, required=True, help="a local LeRobot v3.0 dataset")
    p.add_argument("--out", type=Path, required=True, help="folder for compare.json, compare.md and the plots")
    p.add_argument(
        "--tokenizers",
        default=" ".join(DEFAULT_TOKENIZERS),
        help="space-separated entries name[:option=value,...] of "
        + ", ".join(at.TOKENIZERS)
        + " (default: %(default)s)",
    )
    p.add_argument(
        "--time-horizon",
        "--time_horizon",
        type=int,
        default=None,
        help="T; default the chunk vla train chooses (0.5 s at the fps, cut to the longest episode)",
    )
    p.add_argument(
        "--max-rmse",
        type=float,
        default=MAX_RMSE,
        help="the recommendation's error bound, RMSE in normalised units (default: %(default)s)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an --out folder that already holds files")
    p.add_argument("--episodes-heldout", type=float, default=0.2, help="share of episodes held out for measuring")
    p.add_argument("--sweep", action="store_true", help="also sweep FAST scale, bin count and FSQ levels")
    p.add_argument("--tolerance", type=float, default=0.1, help="max-error threshold (normalised units)")
    p.add_argument(
        "--fsq-steps",
        type=int,
        default=None,
        help=f"FSQ's most training steps (it stops on a plateau); {FSQ_STEPS} here, 3000 in vla train",
    )
    p.add_argument(
        "--fsq-max-seconds",
        type=float,
        default=None,
        help=f"FSQ's fitting time budget; {FSQ_SECONDS:g} s here, none in vla train",
    )
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
        fit_options={"fsq": {"steps": args.fsq_steps, "max_seconds": args.fsq_max_seconds}},
        max_rmse=args.max_rmse,
        overwrite=args.overwrite,
        log=lambda line: print(line, flush=True),
    )
    return 0
