#!/usr/bin/env python
"""Closed-loop success behind a network delay: trained policies (one per training seed) evaluated by ``vla eval``'s
delay model at several delays each way: synchronous, asked ahead, asked ahead with the committed actions sent, and
asked every decode time with several replies on their way, alone or blended (temporal ensembling).

    python scripts/delay_table.py --policy s0=RUN0/policy --policy s1=RUN1/policy ... \\
        [--env metaworld/push-v3] [--episodes 100] [--max-steps 200] [--delays 0,50,100,200] [--out results/delay] \\
        [--schemes "when empty,ahead"]
    python scripts/delay_table.py --study results/STUDY [--work outputs/studies/STUDY] ...   # every finished run

Each policy is evaluated with no delay at all (today's loop), then for each one-way delay D at a round trip of 2D
plus its decode time (``vla eval --delay-ms 2D --decode-ms ...``; the decode is measured once per policy, and once
more with committed actions, so every delay of a policy is the same decode): holding until the reply (``when
empty``), asking ahead (``--ahead``), and asking ahead with the actions that will run meanwhile sent along
(``--ahead --commit``): a binning policy begins its chunk with their ids, a FAST policy keeps the decoded chunk
nearest them (``VLAPolicy.commit_scheme``); and asking ahead every decode time's worth of steps (``--ahead --every
decode``), several replies on their way, as often as a server decoding one request at a time keeps up with, and
the same with each landing reply blended with the chunks still running (``--temporal-ensemble 0.01``, ACT's).
``--schemes`` runs some of them. Writes ``delay.json`` (every evaluation's settings and figures, with provenance;
rewritten after each evaluation: a table of the same task, episodes and step limit continues from it and keeps its
rows, whatever policies, delays or schemes are asked now), ``README.md`` (mean success over the policies, each
policy's, the steps held and the jump at the hand-over) and ``delay.png``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from vla.evaluate import EVAL_SEED_START, evaluate
from vla.io import atomic_write_text, save_figure, write_json
from vla.provenance import provenance
from vla.run_folder import StudyRunFolder


class Scheme(NamedTuple):
    """How the robot asks (``vla eval``'s delay settings)."""

    ahead: bool = False
    commit: bool = False
    every: str | None = None
    ensemble: float | None = None


ACT_ENSEMBLE = 0.01  # ACT's temporal-ensemble coefficient
SCHEMES = {
    "when empty": Scheme(),
    "ahead": Scheme(ahead=True),
    "ahead + commit": Scheme(ahead=True, commit=True),
    "every decode": Scheme(ahead=True, every="decode"),
    "every decode + ensemble": Scheme(ahead=True, every="decode", ensemble=ACT_ENSEMBLE),
}


def commits(policy_dir: str) -> bool:
    """Whether the policy decodes after committed actions (``VLAPolicy.commit_scheme``: conditioned, forced or searched)."""
    from vla.policy.modeling_vla import VLAPolicy

    return VLAPolicy.from_pretrained(policy_dir).commit_scheme is not None


def settings(
    policy: str, delays: list[float], schemes: list[str] | None = None
) -> list[tuple[str, float | None, Scheme]]:
    """``(scheme, round trip ms or None, Scheme)``: no delay, then every delay with each scheme of ``schemes``
    (default all) the policy can use."""
    asked = {k: v for k, v in SCHEMES.items() if schemes is None or k in schemes}
    usable = {k: v for k, v in asked.items() if not v.commit or commits(policy)}
    delayed = [(scheme, 2 * d, how) for d in delays for scheme, how in usable.items()]
    return [("no delay", None, Scheme()), *delayed]


def run(
    policies: dict[str, str],
    env: str,
    episodes: int,
    max_steps: int,
    delays: list[float],
    done: list[dict] | None = None,
    on_row: Callable[[list[dict]], None] | None = None,
    schemes: list[str] | None = None,
    decode_ms: float | None = None,
) -> list[dict]:
    """Every policy's evaluations, each row handed to ``on_row`` (all rows so far) as it finishes; the rows in
    ``done`` (an earlier, stopped table of the same settings) are kept, not run again."""
    rows = list(done or [])
    for name, policy in policies.items():
        mine = [r for r in rows if r["policy"] == name and r["path"] == policy]
        # measured by the first delayed evaluation without and with committed actions (a search decodes several
        # chunks), then given to the others (a resumed table keeps its own)
        decode = {SCHEMES[r["scheme"]].commit: r["decode_ms"] for r in mine if r["decode_ms"] is not None}
        if decode_ms is not None:  # one decode time for every policy: cells comparable across policies and machines
            decode = {False: decode_ms, True: decode_ms}
        for scheme, round_trip, (ahead, commit, every, ensemble) in settings(policy, delays, schemes):
            each_way = None if round_trip is None else round_trip / 2
            if any((r["scheme"], r["delay_ms_each_way"]) == (scheme, each_way) for r in mine):
                continue
            report = None if round_trip is not None else study_eval(policy, env, episodes, max_steps)
            report = report or evaluate(
                policy,
                env,
                episodes,
                max_steps=max_steps,
                delay_ms=round_trip,
                decode_ms=decode.get(commit) if round_trip is not None else None,
                ahead=ahead,
                every=every,
                commit=commit,
                ensemble=ensemble,
                progress=False,
            )
            if round_trip is not None:
                decode.setdefault(commit, report["decode_ms"])
            row = {
                "policy": name,
                "path": policy,
                "scheme": scheme,
                "delay_ms_each_way": each_way,
                "ensemble": report.get("temporal_ensemble"),  # the policy's own when it has one
                **{k: report.get(k) for k in ("success_rate", "episodes", "decode_ms", "delay_steps", "every")},
                **{k: report[k] for k in ("held_steps_mean", "switch_jump_mean", "step_change_mean", "mean_length")},
                "successes": report["successes"],
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "successes"}), flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


ROW_KEYS = ("held_steps_mean", "switch_jump_mean", "step_change_mean", "mean_length", "successes", "success_rate")


def study_eval(policy: str, env: str, episodes: int, max_steps: int) -> dict | None:
    """The evaluation a study run made of ``policy`` with no delay (``<run>/eval/eval_info.json`` beside its
    ``train/policy``) when it is the one asked here: the same task, episodes, first seed and step limit, at the
    policy's own actions per chunk, one beam and no ensemble. None otherwise (evaluated here)."""
    path = StudyRunFolder(Path(policy).parent.parent).eval_info  # a study run's policy: RUN/train/policy
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    asked = report.get("provenance", {}).get("config", {}).get("eval", {})
    wanted = {"env": env, "episodes": episodes, "seed_start": EVAL_SEED_START, "max_steps": max_steps}
    own = json.loads((Path(policy) / "config.json").read_text()).get("n_action_steps")
    same = all(asked.get(k) == v for k, v in wanted.items()) and asked.get("ensemble") is None
    same = same and asked.get("n_action_steps") == own
    if not same or asked.get("num_beams") != 1 or any(k not in report for k in ROW_KEYS):
        return None
    print(f"no delay: {path}, the study's own evaluation (the same settings)")
    return report


def earlier_rows(path: Path, env: str, episodes: int, max_steps: int, policies: dict[str, str]):
    """The rows of a table written before at ``path`` with the same task, episodes and step limit: a stopped run
    continues from them, and a table asked for other policies, delays or schemes adds its rows to them. A row of a
    policy name now given another folder is dropped (that policy is evaluated again); none when there is no table or
    it asked another task, episodes or step limit."""
    if not path.is_file():
        return []
    record = json.loads(path.read_text())
    asked = record.get("provenance", {}).get("config", {})
    if (asked.get("env"), asked.get("episodes"), asked.get("max_steps")) != (env, episodes, max_steps):
        print(f"note: {path} holds evaluations of other settings; they are replaced")
        return []
    return [r for r in record["rows"] if policies.get(r["policy"], r["path"]) == r["path"]]


def study_policies(results: Path, work: Path | None) -> dict[str, str]:
    """``{run id: policy folder}`` for every finished run of a study (``results/<name>/runs.json``), its run
    folders under ``work`` (default ``outputs/studies/<name>``)."""
    record = json.loads((results / "runs.json").read_text())
    work = work or Path("outputs/studies") / record["study"]["name"]
    policies = {r["id"]: str(StudyRunFolder(work / r["id"]).train.policy) for r in record["runs"]}
    missing = [p for p in policies.values() if not Path(p).is_dir()]
    if missing:
        raise SystemExit(f"no policy at {missing[0]}: run the study there first (vla study run), or give --work")
    return policies


def group(name: str) -> str:
    """The policies a name's seeds pool with: the name without its seed (``chunk40-bin-s2`` -> ``chunk40-bin``, a
    study's run id; ``s2`` -> all)."""
    return re.sub(r"(^|-)s\d+$", "", name) or "all"


def table(rows: list[dict]) -> list[dict]:
    """One line per (group, delay, scheme): the mean over the group's policies (training seeds) and each one's
    success; a group's lines together (in the order the groups first appear), no delay first, then scheme by scheme
    (in ``SCHEMES``' order), each by delay."""
    cells = {}
    for r in rows:
        cells.setdefault((group(r["policy"]), r["delay_ms_each_way"], r["scheme"]), []).append(r)
    groups = list(dict.fromkeys(name for name, _, _ in cells))
    order = {scheme: i for i, scheme in enumerate(SCHEMES)}

    def place(key: tuple) -> tuple:
        name, delay, scheme = key
        return groups.index(name), -1 if delay is None else order.get(scheme, len(order)), delay or 0.0

    out = []
    for (name, delay, scheme), rs in sorted(cells.items(), key=lambda item: place(item[0])):
        rates = [r["success_rate"] for r in rs]
        out.append(
            {
                "group": name,
                "delay_ms_each_way": delay,
                "scheme": scheme,
                "mean": float(np.mean(rates)),
                "std": float(np.std(rates, ddof=1)) if len(rates) > 1 else None,
                "per_policy": {r["policy"]: r["success_rate"] for r in rs},
                "delay_steps": sorted({r["delay_steps"] for r in rs if r["delay_steps"] is not None}),
                "decode_ms": float(np.mean(decodes))
                if (decodes := [r["decode_ms"] for r in rs if r["decode_ms"]])
                else None,
                "held": float(np.mean([r["held_steps_mean"] for r in rs])),
                "jump": float(np.mean([r["switch_jump_mean"] for r in rs])),
                "within": float(np.mean([r["step_change_mean"] for r in rs])),
            }
        )
    return out


def markdown(cells: list[dict], args, paths: dict[str, str]) -> str:
    """The page: every policy of the table (``paths``: name -> folder), not only those asked this time."""
    lines = [
        "# Closed-loop success behind a network delay (`scripts/delay_table.py`)",
        "",
        f"{args.env}, {args.episodes} episodes per policy and setting (at most {args.max_steps} steps), "
        f"{len(paths)} policies: {', '.join(f'{k}={v}' for k, v in paths.items())}; a run's training seeds pool (its name without "
        "-s<seed>). A reply arrives the round trip (twice "
        "the one-way delay) plus the measured decode time after its observation, in control steps at the simulator's "
        "rate; the simulator steps meanwhile (`vla eval --delay-ms`). *When empty*: the robot asks when its chunk has "
        "run and holds until the reply; *ahead*: it asks that many actions early and skips the reply's actions for "
        "the steps that ran meanwhile; *ahead + commit*: it also sends the actions that will run meanwhile, and the "
        "policy decodes its chunk after them (a policy trained with `commit_condition`: read beside the state; binning: "
        "its first ids forced; other tokenizers: the decoded chunk nearest them of several, a search); *every decode*: it asks ahead every decode time's worth of steps, several "
        "replies on their way, each skipping the actions that ran meanwhile; *+ ensemble*: each landing reply blended "
        f"with the chunks still running (ACT's temporal ensembling, coefficient {ACT_ENSEMBLE}). The decode time is measured once per policy, and once more with "
        "committed actions. The jump is the mean |a_t - a_(t-1)| where a new chunk takes over (within "
        "chunks in brackets).",
        "",
        "| policies | delay each way | scheme | decode ms | steps late | mean success | std (policies) | per policy | "
        "steps held an episode | jump at the hand-over |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        delay = "none" if c["delay_ms_each_way"] is None else f"{c['delay_ms_each_way']:g} ms"
        std = "n/a" if c["std"] is None else f"{100 * c['std']:.1f} pts"
        per = ", ".join(f"{k}: {v:.0%}" for k, v in c["per_policy"].items())
        steps = "/".join(str(s) for s in c["delay_steps"]) or "0"
        decode = "-" if c["decode_ms"] is None else f"{c['decode_ms']:.0f}"
        lines.append(
            f"| {c['group']} | {delay} | {c['scheme']} | {decode} | {steps} | **{c['mean']:.0%}** | {std} | {per} | {c['held']:.1f} | "
            f"{c['jump']:.3f} ({c['within']:.3f}) |"
        )
    return "\n".join(lines) + "\n\n![success against delay](delay.png)\n"


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = dict(zip(SCHEMES, ("s:", "o-", "^--", "D-.", "v-")))
    for i, name in enumerate(dict.fromkeys(c["group"] for c in cells)):
        mine = [c for c in cells if c["group"] == name]
        colour = colours[i % len(colours)]
        for scheme in SCHEMES:
            pts = sorted((c["delay_ms_each_way"], c["mean"]) for c in mine if c["scheme"] == scheme)
            if pts:
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], styles[scheme], color=colour, label=f"{name}: {scheme}"
                )
        base = next((c for c in mine if c["delay_ms_each_way"] is None), None)
        if base is not None:
            ax.axhline(base["mean"], color=colour, ls=(0, (1, 3)), lw=1, label=f"{name}: no delay")
    ax.set(xlabel="delay each way (ms)", ylabel="success (mean over policies)", ylim=(0, 1.05))
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the curves, not over them
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--policy", action="append", help="NAME=POLICY_FOLDER, one per training seed")
    source.add_argument("--study", type=Path, help="a study's results folder: every finished run's policy")
    parser.add_argument("--work", type=Path, help="with --study: its run folders (default outputs/studies/<name>)")
    parser.add_argument("--env", default="metaworld/push-v3")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--delays", default="0,50,100,200", help="one-way delays in ms")
    parser.add_argument("--out", type=Path, default=Path("results/delay"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--decode-ms",
        type=float,
        default=None,
        help="the decode time of every policy (default: measured once per policy, which depends on the machine and "
        "its load)",
    )
    parser.add_argument(
        "--schemes", default=",".join(SCHEMES), help=f"comma list of the schemes to run (of: {', '.join(SCHEMES)})"
    )
    args = parser.parse_args()
    if args.study is not None:
        policies = study_policies(args.study, args.work)
        args.policy = [f"{k}={v}" for k, v in policies.items()]
    else:
        policies = dict(p.split("=", 1) for p in args.policy)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    delays = [float(d) for d in args.delays.split(",")]
    schemes = [s.strip() for s in args.schemes.split(",")]
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        parser.error(f"--schemes: unknown {', '.join(map(repr, unknown))}; the schemes: {', '.join(SCHEMES)}")
    done = earlier_rows(args.out / "delay.json", args.env, args.episodes, args.max_steps, policies)

    def write(rows: list[dict]) -> None:  # after every evaluation: a stopped table loses one evaluation at most
        cells = table(rows)
        record = {"rows": rows, "cells": cells, "provenance": provenance(config=config, threads=args.threads)}
        write_json(args.out / "delay.json", record)
        paths = {r["policy"]: r["path"] for r in rows}
        atomic_write_text(args.out / "README.md", markdown(cells, args, paths))
        plot(cells, args.out / "delay.png")

    write(
        run(
            policies,
            args.env,
            args.episodes,
            args.max_steps,
            delays,
            done,
            on_row=write,
            schemes=schemes,
            decode_ms=args.decode_ms,
        )
    )
    print(f"wrote {args.out}/delay.json, README.md and delay.png")


if __name__ == "__main__":
    main()
