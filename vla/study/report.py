"""A study's results: ``runs.json`` (every finished run, and the records kept from earlier versions of the study file,
``vla.study.records``), ``README.md`` (the question, the command, a row per grid cell: mean over training seeds,
spread, each seed, Wilson 95% interval over the pooled episodes; then which gaps are significant) and ``success.png``
(a bar per cell at its mean, the seeds as dots, the Wilson interval as a line). A cell whose runs were trained on
different datasets is marked mixed and gets no verdict.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

from vla.io import atomic_write_text, save_figure
from vla.provenance import provenance
from vla.study.commands import identity
from vla.study.records import FORMAT, RUNS_FILE, changes, legacy_identity, merged, read_runs, write_runs
from vla.study.spec import Study, check_study
from vla.study.stats import MIN_SEEDS, aggregate, compare


def cells(study: Study, runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(setting, tokenizer) -> ``stats.aggregate`` of its finished runs, in the study's order."""
    out = {}
    for setting in study.settings:
        for tok in study.tokenizers:
            mine = [r for r in runs if r["setting"] == setting and r["tokenizer"] == tok]
            if mine:
                out[(setting, tok)] = aggregate(mine)
                datasets = sorted({d for d in map(_dataset, mine) if d is not None})
                if len(datasets) > 1:  # a mean over runs that saw different data is no verdict on either
                    out[(setting, tok)].update(mixed=True, datasets=datasets)
    return out


def _dataset(record: dict[str, Any]) -> str | None:
    """The sha256 of the dataset a run was trained on (None when its record does not say)."""
    block = record.get("provenance")
    data = block.get("dataset") if isinstance(block, dict) else None
    return data.get("sha256") if isinstance(data, dict) else None


def comparisons(study: Study, table: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pair of tokenizers within a setting, the better mean first."""
    found = []
    for setting in study.settings:
        present = [t for t in study.tokenizers if (setting, t) in table]
        for a, b in itertools.combinations(present, 2):
            ca, cb = table[(setting, a)], table[(setting, b)]
            if cb["mean"] > ca["mean"]:
                a, b, ca, cb = b, a, cb, ca
            verdict = compare(ca, cb)
            if ca.get("mixed") or cb.get("mixed"):
                why = "a cell mixes runs trained on different datasets"
                verdict = {"gap": verdict["gap"], "p_value": None, "significant": False, "why": why}
            found.append({"setting": setting, "better": a, "worse": b, **verdict})
    return found


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def markdown(study: Study, table: dict, pairs: list[dict], runs: list[dict[str, Any]], earlier: int = 0) -> str:
    total = len(study.runs())
    lines = [
        f"# Study `{study.name}`",
        "",
        *([f"**Question.** {study.question}", ""] if study.question else []),
        f"**Reproduce:** `vla study run {study.path}` (resumable; `vla study table` redraws this page from "
        "`runs.json`, where every run records its commit, config, dataset fingerprint, threads and packages).",
        "",
        f"{len(runs)} of {total} runs finished. Each run: `vla train --config_path {study.config}` "
        f"{' '.join(study.train)} with its setting's and tokenizer's arguments and `--seed`, then "
        f"{study.eval['episodes']} evaluation episodes of {study.eval['env']}/{study.eval['task']}; "
        f"{side_by_side(study.workers)}, {study.threads} torch thread(s) each. Mean and std are over training "
        "seeds; the Wilson 95% interval is over all the cell's episodes (the evaluation's noise only).",
        "",
        "| setting | tokenizer | seeds | mean | std | min | per seed | Wilson 95% (episodes) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (setting, tok), c in table.items():
        few = " (too few seeds for a verdict)" if len(c["seeds"]) < MIN_SEEDS else ""
        if c.get("mixed"):
            few += f" (mixed data: {len(c['datasets'])} datasets, not a verdict)"
        spread = f"{100 * c['std']:.1f} pts" if len(c["seeds"]) > 1 else "n/a"
        per_seed = ", ".join(f"s{s}: {_pct(r)}" for s, r in zip(c["seeds"], c["rates"]))
        lines.append(
            f"| {setting} | {tok} | {len(c['seeds'])}{few} | **{_pct(c['mean'])}** | {spread} | "
            f"{_pct(c['min'])} | {per_seed} | {_pct(c['wilson95'][0])}-{_pct(c['wilson95'][1])} ({c['episodes']}) |"
        )
    if pairs:
        lines += [
            "",
            "| setting | better | worse | gap | p (Welch, seeds) | significant at 5% |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for p in pairs:
            pv = "n/a" if p["p_value"] is None else f"{p['p_value']:.3f}"
            pv += " (Fisher, episodes: the seeds agree)" if p.get("test") == "fisher" else ""
            lines.append(
                f"| {p['setting']} | {p['better']} | {p['worse']} | {100 * p['gap']:+.0f} pts | {pv} | "
                f"{'no verdict (' + p['why'] + ')' if p['p_value'] is None else 'yes' if p['significant'] else 'no'} |"
            )
    lines += task_lines(table, runs)
    if earlier:
        kept = (
            f"`runs.json` also keeps {earlier} record(s) of runs an earlier version of the study file produced "
            "(`earlier_runs`: a seed removed, or a run trained again after its settings changed); they are not in "
            "this table."
        )
        lines += ["", kept]
    lines += ["", "![success per cell](success.png)", ""]
    return "\n".join(lines)


def task_lines(table: dict, runs: list[dict[str, Any]]) -> list[str]:
    """For a multi-task evaluation: each cell's success per task, the mean over training seeds and their range."""
    tasks = next((list(r["task_successes"]) for r in runs if r.get("task_successes")), None)
    if not tasks:
        return []
    lines = [
        "",
        "Per task (mean over training seeds, the seeds' range in brackets):",
        "",
        "| setting | tokenizer | " + " | ".join(tasks) + " |",
        "| --- | --- |" + " --- |" * len(tasks),
    ]
    for setting, tok in table:
        mine = [r for r in runs if r["setting"] == setting and r["tokenizer"] == tok and r.get("task_successes")]
        if not mine:
            continue
        row = []
        for task in tasks:
            c = aggregate([{"seed": r["seed"], "successes": r["task_successes"][task]} for r in mine])
            row.append(f"{_pct(c['mean'])} ({_pct(c['min'])}-{_pct(c['max'])})")
        lines.append(f"| {setting} | {tok} | " + " | ".join(row) + " |")
    return lines


def plot(study: Study, table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(table)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(keys) + 1.5), 3.6))
    for i, key in enumerate(keys):
        c = table[key]
        ax.bar(i, 100 * c["mean"], color="#9ecae1", edgecolor="#3182bd", width=0.6)
        ax.errorbar(i, 100 * c["mean"], yerr=100 * c["std"], color="#08519c", capsize=6, lw=1.5)
        ax.plot([i + 0.36] * 2, [100 * c["wilson95"][0], 100 * c["wilson95"][1]], color="#636363", lw=3)
        ax.scatter([i] * len(c["rates"]), [100 * r for r in c["rates"]], color="black", s=14, zorder=3)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([t if len(study.settings) == 1 else f"{s}\n{t}" for s, t in keys], fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("success (%)")
    legend = "mean over seeds (bar), std (blue), seeds (dots),\nWilson 95% over the episodes (grey)"
    ax.set_title(f"{study.name}\n{legend}", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def write_results(study: Study, runs: list[dict[str, Any]], out: Path, fingerprint: dict[str, Any] | None) -> dict:
    """``runs.json``, ``README.md``, ``success.png`` under ``out``; returns what ``runs.json`` holds. Records are only
    added: the old file's records that ``runs`` lacks are kept in ``earlier_runs`` (and a copy of the old file is
    written beside it first when one changes); a file that cannot be read, or another study's, is refused."""
    old = read_runs(out / RUNS_FILE)
    if old is not None and old["study"].get("name") != study.name:
        raise ValueError(
            f"{out / RUNS_FILE} holds study {old['study'].get('name')!r}, not {study.name!r}; give this "
            f"study its own folder (results/{study.name})"
        )
    out.mkdir(parents=True, exist_ok=True)
    table = cells(study, runs)
    pairs = comparisons(study, table)
    summary = {
        "format": FORMAT,
        "study": {k: v for k, v in dataclasses.asdict(study).items() if k != "path"},
        "study_file": study.path,
        "cells": [{"setting": s, "tokenizer": t, **c} for (s, t), c in table.items()],
        "comparisons": pairs,
        "runs": runs,
        "earlier_runs": merged(old, runs),
        "provenance": provenance(config=dataclasses.asdict(study), fingerprint=fingerprint),
    }
    backup = write_runs(out / RUNS_FILE, summary)
    if backup is not None:
        print(f"{out / RUNS_FILE}: a record changed or moved to earlier_runs; the previous file is kept as {backup}")
    atomic_write_text(out / "README.md", markdown(study, table, pairs, runs, len(summary["earlier_runs"])))
    if table:
        plot(study, table, out / "success.png")
    return summary


def rewrite(results: Path, study: Study | None = None) -> dict[str, Any]:
    """The README and plot again from a ``runs.json`` (``vla study table DIR``); ``study`` (the study file read
    again) replaces the recorded description, e.g. after its question was reworded."""
    results = Path(results)
    summary = read_runs(results / RUNS_FILE)
    if summary is None:
        raise FileNotFoundError(
            f"no {RUNS_FILE} in {results}: a study's results folder holds one once a run has "
            "finished; run `vla study run configs/studies/NAME.yaml` first (it writes "
            "results/NAME/)"
        )
    recorded = check_study(summary["study"], f"{results / RUNS_FILE} (its study block)", summary.get("study_file"))
    if study is not None and study.name != recorded.name:
        raise ValueError(
            f"--study {study.path} is study {study.name!r}, but {results / RUNS_FILE} holds "
            f"{recorded.name!r}; give that study's file or none"
        )
    if study is not None:
        _check_same_runs(study, summary, results)
    study = study or recorded
    block = summary.get("provenance")
    fingerprint = block.get("dataset") if isinstance(block, dict) else None
    return write_results(study, summary["runs"], results, fingerprint)


def _check_same_runs(study: Study, summary: dict[str, Any], results: Path) -> None:
    """A study file given to ``vla study table`` describes the page: refused when it asks for other settings than
    produced a recorded run (the page would state the new settings over the old results)."""

    runs = {run.id: run for run in study.runs()}
    for record in summary["runs"]:
        run = runs.get(record["id"])
        if run is None:
            continue
        had = record.get("identity") or legacy_identity(record, summary["study"].get("eval"))
        why = changes(had, identity(study, run))
        if why is not None:
            raise ValueError(
                f"{results / RUNS_FILE}: run {run.id}: {why} in {study.path}; the page would describe "
                "other settings than its runs had: run vla study run with --rerun-changed, or leave out "
                "--study"
            )


def side_by_side(workers: int) -> str:
    """How the runs shared the machine, in words."""
    return "one run at a time" if workers == 1 else f"{workers} runs side by side"
