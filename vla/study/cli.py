"""``vla study run FILE`` and ``vla study table DIR`` (see ``vla.study.runner``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("study", help="closed-loop studies: tokenizers x settings x training seeds")
    sub = p.add_subparsers(dest="study_command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="train and evaluate every run of a study not yet finished (resumable)")
    run.add_argument("study", type=Path, help="a study file (configs/studies/*.yaml)")
    run.add_argument("--work", type=Path, default=None, help="run folders (default: outputs/studies/<name>)")
    run.add_argument(
        "--results", type=Path, default=None, help="runs.json, README.md, success.png (default: results/<name>)"
    )
    run.add_argument("--workers", type=int, default=None, help="runs side by side (default: the study's)")
    run.add_argument(
        "--allow-dirty", action="store_true", help="run with uncommitted changes (each run records dirty: true)"
    )
    run.add_argument(
        "--rerun-changed",
        action="store_true",
        help="train and evaluate again the finished runs whose settings the study file has changed (their "
        "old records are kept in runs.json's earlier_runs, their folders moved aside)",
    )
    run.add_argument("--dry-run", action="store_true", help="list the runs and their commands, run nothing")
    run.set_defaults(func=_run)
    table = sub.add_parser("table", help="write README.md and success.png again from a study's runs.json")
    table.add_argument("results", type=Path, help="a study's results folder (holding runs.json)")
    table.add_argument("--study", type=Path, default=None, help="the study file, read again for its description")
    table.set_defaults(func=_table)


def _run(args: argparse.Namespace) -> int:
    import dataclasses

    from vla.study.commands import train_command
    from vla.study.records import RUNS_FILE, read_runs
    from vla.study.runner import check_results_folder, check_training_arguments, plan, run_study
    from vla.study.spec import load_study

    study = load_study(args.study)
    if args.workers is not None:
        if args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        study = dataclasses.replace(study, workers=args.workers)
    if args.dry_run:
        work = args.work or Path("outputs/studies") / study.name
        results = args.results or Path("results") / study.name
        check_training_arguments(study, study.runs())
        check_results_folder(study, results, read_runs(results / RUNS_FILE))
        status = plan(study, work, results)
        for run in study.runs():
            state = "finished" if run.id in status.done else "to run"
            if run.id in status.changed:
                state = f"changed: {status.changed[run.id]}; refused without --rerun-changed"
            print(f"{run.id} ({state}): vla {' '.join(train_command(study, run, work / run.id)[3:])}")
        return 0
    summary = run_study(
        study, work=args.work, results=args.results, allow_dirty=args.allow_dirty, rerun_changed=args.rerun_changed
    )
    for cell in summary["cells"]:
        mixed = f", mixed data from {len(cell['datasets'])} datasets: no verdict" if cell.get("mixed") else ""
        print(
            f"{cell['setting']} {cell['tokenizer']}: {cell['mean']:.1%} +- {cell['std']:.1%} over seeds "
            f"{cell['seeds']} (min {cell['min']:.0%}{mixed})"
        )
    return 0


def _table(args: argparse.Namespace) -> int:
    from vla.study.report import rewrite
    from vla.study.spec import load_study

    summary = rewrite(args.results, load_study(args.study) if args.study else None)
    print(f"wrote {args.results}/README.md and success.png ({len(summary['runs'])} runs)")
    return 0
