"""``vla tokenizer fit``: fit one action tokenizer on a dataset's training episodes, save it with its normaliser,
and report how well it does on the held-out ones (LeRobot users know this as ``lerobot-train-tokenizer``).

    vla tokenizer fit --root DATASET --type fast [--time-horizon T] [--option scale=5 ...] --out DIR [--sweep]

The normaliser is the exact q01/q99 of the training episodes' frames (not ``meta/stats.json``'s averaged
quantiles). ``DIR`` then holds the tokenizer (``action_tokenizer.json`` + its files) with ``action_normalizer.json``
beside it, and ``report.json`` / ``report.md`` / ``rate_distortion.png`` (tokens per chunk, RMSE, compression, valid
rates; ``--sweep`` adds the tokenizer's rate-distortion curve). ``vla train --tokenizer.type=fast
--tokenizer.pretrained_path=DIR`` trains with it, normaliser included.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import action_tokenizers as at

from vla.compare import load_split, measure, parse_entry, sweep
from vla.compare_report import write_outputs
from vla.io import atomic_directory
from vla.provenance import provenance
from vla.tokenizer_choice import NORMALIZER_FILE


def fit_tokenizer(
    root: str | Path,
    out_dir: str | Path,
    spec: str,
    *,
    time_horizon: int | None = None,
    heldout: float = 0.2,
    do_sweep: bool = False,
    seed: int = 0,
    log=print,
) -> dict[str, Any]:
    """Fit ``spec`` (``name[:option=value,...]``) on ``root``'s training episodes, save it to ``out_dir``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"--out {out_dir} exists and is not an empty folder; choose a new one")
    entry = parse_entry(spec)
    split = load_split(Path(root), time_horizon, heldout, seed, log)
    log(
        f"fitting {entry.label} on {len(split.train)} chunks of T={split.time_horizon} "
        f"({len(split.train_episodes)} episodes); measuring on {len(split.heldout)}"
    )
    start = time.perf_counter()
    options = (
        {"show_progress": True}
        if "show_progress" in at.get_tokenizer_class(entry.name).Options.__dataclass_fields__
        else {}
    )
    tok = entry.fit(split.train, **options)
    fit_s = time.perf_counter() - start
    for line in tok.choices():
        log(f"chose {line}")
    report = {
        "dataset": str(root),
        "time_horizon": split.time_horizon,
        "action_dim": int(split.heldout.shape[2]),
        "n_train_chunks": len(split.train),
        "n_heldout_chunks": len(split.heldout),
        "tolerance": 0.1,
        "heldout_std": float(split.heldout.std()),
        "train_episodes": split.train_episodes,
        "heldout_episodes": split.heldout_episodes,
        "tokenizers": {entry.label: {"fit_seconds": fit_s, **measure(tok, split, 0.1, 1000, seed)}},
    }
    if do_sweep:
        report["sweep"] = sweep(split, [entry], {}, log)
    report["provenance"] = provenance(
        config=dict(tokenizer=spec, time_horizon=time_horizon, heldout=heldout, sweep=do_sweep, seed=seed), dataset=root
    )
    with atomic_directory(out_dir) as tmp:
        tok.save_pretrained(tmp / "tokenizer")
        for path in (tmp / "tokenizer").iterdir():  # the tokenizer's files at the top of the folder
            path.rename(tmp / path.name)
        (tmp / "tokenizer").rmdir()
        split.normalizer.save(tmp / NORMALIZER_FILE)
        write_outputs(report, tmp, name="report")
    row = report["tokenizers"][entry.label]
    log(
        f"{entry.label}: {row['tokens_per_chunk_mean']:.1f} tokens per chunk ({row['compression']:.2f}x), "
        f"held-out RMSE {row['rmse']:.4f}, valid {row['valid_rate_heldout']:.1%}; fitted in {fit_s:.1f} s; "
        f"wrote {out_dir}"
    )
    return report


def add_cli(subparsers) -> None:
    group = subparsers.add_parser(
        "tokenizer",
        help="fit an action tokenizer on a dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group.set_defaults(func=lambda args: group.print_help() or 2)
    sub = group.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND")
    p = sub.add_parser("fit", help="fit on the training episodes, save with the normaliser, report held-out error")
    p.add_argument("--root", "--dataset_root", type=Path, required=True, help="a local LeRobot v3.0 dataset")
    p.add_argument(
        "--type",
        required=True,
        help="the tokenizer, as vla compare names it: "
        + ", ".join(at.TOKENIZERS)
        + ", with options name:option=value,... (e.g. bin:n_bins=128)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a fit option of the tokenizer (repeatable), e.g. --option scale=5",
    )
    p.add_argument(
        "--time-horizon",
        type=int,
        default=None,
        help="T; default the chunk vla train chooses (half a second at the data's fps, cut to the longest episode)",
    )
    p.add_argument("--episodes-heldout", type=float, default=0.2, help="share of episodes held out for the report")
    p.add_argument("--sweep", action="store_true", help="add the tokenizer's rate-distortion curve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="a new folder for the tokenizer and its report")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    joiner = "," if ":" in args.type else ":"
    spec = args.type + (joiner + ",".join(args.option) if args.option else "")
    fit_tokenizer(
        args.root,
        args.out,
        spec,
        time_horizon=args.time_horizon,
        heldout=args.episodes_heldout,
        do_sweep=args.sweep,
        seed=args.seed,
    )
    print(json.dumps({"out": str(args.out)}))
    return 0
