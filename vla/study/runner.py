"""Run a closed-loop study (``vla.study.spec``): every run trained and evaluated in its own process, ``workers`` at a
time with ``threads`` torch threads each, resumable, every finished run recorded with what produced it.

    vla study run configs/studies/push_pixels.yaml     # trains + evaluates what is not done yet, then the table
    vla study table results/push_pixels                # the README and plot again from runs.json

Layout: ``outputs/studies/<name>/<run id>/`` holds each run's training folder (``train/``), its evaluation
(``eval/eval_info.json``), what produced it (``identity.json``), its log and, once finished, ``run.json``;
``results/<name>/`` holds ``runs.json`` (every finished run: its identity, full training config, commit, dataset
fingerprint, threads, package versions, wall times and per-episode successes; ``vla.study.records``), ``README.md``
(question, command, table) and ``success.png`` (``vla.study.report``), rewritten after every run.

Everything that can be checked is checked before the first run trains: the study file (``vla.study.spec``), every
run's ``vla train`` arguments, the results folder (this study's, or new). One study run holds a work folder at a
time (``study.lock``, ``vla.study.lock``); its children run in their own process groups and end with it.

A killed study continues where it stopped: finished runs (``run.json``, or their record in ``results/<name>/runs.json``
when the work folder is gone) are kept while their identity (``identity``: the training command, the base config's
content, the evaluation, the threads) is what the study file asks; a changed one is named and refused, or trained
again with ``--rerun-changed``. A training with checkpoints is resumed from its last one (``--resume=true``, exact),
one killed before its first checkpoint starts again, and an evaluation is redone when its ``eval_info.json`` is
missing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vla.io import write_json
from vla.provenance import dataset_fingerprint, git_state, portable_command, provenance
from vla.run_folder import RunFolder, StudyRunFolder
from vla.study.commands import eval_command, identity, train_command, vla_command
from vla.study.lock import Children, Stopped, StudyLock
from vla.study.records import (
    RUNS_FILE,
    changes,
    legacy_identity,
    read_record,
    read_runs,
    without_output_dir,
)
from vla.study.spec import Run, Study, read_eval_arguments
from vla.study.stats import MIN_SEEDS

PAGES = ("README.md", "success.png")  # what vla study run writes beside runs.json


def ensure_dataset(study: Study, log=print, children: Children | None = None) -> Path:
    """The study's dataset, recorded with ``study.record`` when it is missing."""
    root = Path(study.dataset)
    if (root / "meta" / "info.json").is_file():
        return root
    if study.record is None:
        raise FileNotFoundError(
            f"the study's dataset {root} does not exist and the study has no 'record' arguments; "
            "record it first or add `record: [...]` (vla data record arguments)"
        )
    log(f"recording the study's dataset into {root}")
    cmd = vla_command("data", "record", *study.record, "--root", str(root), "--quiet")
    code = (children or Children()).run(cmd)
    if code != 0:
        raise RuntimeError(
            f"recording the study's dataset failed (exit {code}): {' '.join(cmd[3:])}; fix the "
            "study's 'record' arguments or record the dataset yourself"
        )
    return root


def _folder_identity(folder: Path, wants: dict[str, Any]) -> dict[str, Any]:
    """What a run folder was started with: its ``identity.json``, else (a folder from before it existed) the
    ``vla train`` and ``vla eval`` commands its log lists; empty when neither says."""
    path = StudyRunFolder(folder).identity
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            found = None
        if not isinstance(found, dict):
            raise ValueError(f"{path} cannot be read; delete the run folder {folder} to train the run again")
        return found
    had: dict[str, Any] = {}
    log = StudyRunFolder(folder).log
    lines = log.read_text().splitlines() if log.is_file() else []
    for line in lines:
        if not line.startswith("$ ") or " -m vla.cli " not in line:
            continue
        words = line.split(" -m vla.cli ", 1)[1].split(" ")
        if words[0] == "train":
            train = without_output_dir(portable_command(["vla", *words]))
            same = " ".join(train) == " ".join(wants["train"])  # an argument holding a space reads as two
            if "train" not in had or not same:
                had["train"] = wants["train"] if same else train
        elif words[0] == "eval" and (evaluation := read_eval_arguments(words[1:])) is not None:
            had["eval"] = evaluation
    return had


@dataclass
class Plan:
    """Where each run of a study stands (``plan``)."""

    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> its record, finished as the file says
    shown: dict[str, dict[str, Any]] = field(default_factory=dict)  # done, and runs.json's records of runs redone
    todo: list[Run] = field(default_factory=list)  # to train and evaluate (or finish)
    changed: dict[str, str] = field(default_factory=dict)  # run id -> what the study file changed since it ran
    stale_folders: list[str] = field(default_factory=list)  # changed runs with a work folder (moved aside on rerun)
    summary: dict[str, Any] | None = None  # runs.json as read


def plan(study: Study, work: Path, results: Path | None = None) -> Plan:
    """Each run of ``study``: finished (its ``run.json`` under ``work``, else its record in ``results/runs.json``
    when it has no folder there), changed (what produced it differs from what the study file now asks) or to run."""
    out = Plan(summary=read_runs(results / RUNS_FILE) if results is not None else None)
    study_eval = out.summary["study"].get("eval") if out.summary else None
    by_id = {r["id"]: r for r in out.summary["runs"]} if out.summary else {}
    for run in study.runs():
        wants, folder = identity(study, run), work / run.id
        record = read_record(StudyRunFolder(folder).record)
        if record is None and not folder.exists():
            record = by_id.get(run.id)
        if record is not None:
            had = record.get("identity") or {**_folder_identity(folder, wants), **legacy_identity(record, study_eval)}
            why = changes(had, wants)
            if record.get("seed") != run.seed or record.get("overrides", list(run.overrides)) != list(run.overrides):
                why = why or f"training arguments {record.get('overrides')} are now {list(run.overrides)}"
            if why is None:
                out.done[run.id] = out.shown[run.id] = record
                continue
            out.changed[run.id] = why
        elif folder.exists():  # started, not finished: what it was started with must still hold
            why = changes(_folder_identity(folder, wants), wants)
            if why is not None:
                out.changed[run.id] = why
            elif run.id in by_id:  # an earlier finish of the same run, shown until this one ends
                old = by_id[run.id]
                if changes(old.get("identity") or legacy_identity(old, study_eval), wants) is None:
                    out.shown[run.id] = old
        if run.id in out.changed and folder.exists():
            out.stale_folders.append(run.id)
        out.todo.append(run)
    return out


def finished(study: Study, work: Path, results: Path | None = None) -> list[dict[str, Any]]:
    """The finished runs of ``study``, in the study's order: each run's ``run.json`` under ``work``, else, when the
    run has no folder there (a study continued on another machine), its record in ``results/runs.json``; each counts
    only while what produced it (``identity``) is what the study file asks."""
    done = plan(study, work, results).done
    return [done[run.id] for run in study.runs() if run.id in done]


def _final_loss(train_dir: Path) -> float | None:
    losses = [row.get("loss") for row in RunFolder(train_dir).metrics_rows()]
    losses = [x for x in losses if isinstance(x, int | float)]
    return float(losses[-1]) if losses else None


def _resumable(cmd: list[str], train_dir: Path) -> list[str]:
    """Resume from the last checkpoint; a training killed before its first one starts again (nothing to keep)."""
    if RunFolder(train_dir).saved_checkpoints():
        return [*cmd, "--resume=true"]
    if train_dir.exists():
        shutil.rmtree(train_dir)
    return cmd


def _read_eval(folder: Path, run: Run) -> dict[str, Any]:
    """The run's ``eval_info.json``, checked; a broken one is named with the fix (the run's record elsewhere stays)."""
    path = StudyRunFolder(folder).eval_info
    try:
        report = json.loads(path.read_text())
        _episodes(report)
        if not isinstance(report.get("success_rate"), int | float):
            raise ValueError("no success_rate")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        reason = str(err).splitlines()[0] if str(err) else repr(err)
        raise ValueError(
            f"run {run.id}: {path} cannot be read ({reason}); delete it and run the study again to "
            "evaluate the run again (its finished record, if any, is kept)"
        ) from None
    return report


def execute(
    study: Study, run: Run, folder: Path, fingerprint: dict[str, Any], children: Children | None = None
) -> dict[str, Any]:
    """Train (or resume) and evaluate one run in child processes, then write its ``run.json``."""
    children = children or Children()
    folder.mkdir(parents=True, exist_ok=True)
    place = StudyRunFolder(folder)
    if not place.identity.exists():
        write_json(place.identity, identity(study, run))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(study.threads),
        "MKL_NUM_THREADS": str(study.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    walls: dict[str, float] = _read(place.walls) or {}  # seconds per stage, summed over resumes
    with place.log.open("a") as log:
        for stage in ("train", "eval"):
            if stage == "train" and place.train.policy.is_dir():
                continue
            if stage == "eval" and place.eval_info.is_file():
                continue
            if stage == "train":
                cmd = _resumable(train_command(study, run, folder), place.train.path)
            else:
                cmd = eval_command(study, folder)
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            start = time.perf_counter()
            code = children.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            walls[stage] = walls.get(stage, 0.0) + time.perf_counter() - start
            write_json(place.walls, walls)
            if code != 0:
                raise RuntimeError(f"run {run.id}: {stage} failed (exit {code}); see {place.log}")
    train_config = json.loads(place.train.config.read_text())
    report = _read_eval(folder, run)
    successes, seeds, per_task = _episodes(report)
    record = {
        "id": run.id,
        "setting": run.setting,
        "tokenizer": run.tokenizer,
        "seed": run.seed,
        "overrides": list(run.overrides),
        "identity": _read(place.identity) or identity(study, run),  # what it was started with, not the file now
        "successes": successes,
        "episode_seeds": seeds,
        **({"task_successes": per_task} if per_task else {}),
        "success_rate": report["success_rate"],
        "mean_length": report.get("mean_length"),
        "tokens_per_chunk": report.get("tokens_per_chunk"),
        "valid_chunk_rate": report.get("valid_chunk_rate"),
        "latency_ms_mean": report.get("latency_ms_mean"),
        "final_loss": _final_loss(place.train.path),
        **({"offline": offline} if (offline := _offline(place.train.path)) else {}),
        "train_wall_s": walls.get("train"),
        "eval_wall_s": walls.get("eval"),
        # The command that reproduces the run's training (its evaluation: study.eval).
        "provenance": provenance(
            config=train_config,
            fingerprint=fingerprint,
            threads=study.threads,
            workers=study.workers,
            command=["vla", *train_command(study, run, folder)[3:]],
        ),
    }
    write_json(place.record, record)
    return record


def _offline(train_dir: Path) -> dict[str, Any] | None:
    """The held-out measures of the run's offline report (when it held episodes out): what a study can set beside
    closed-loop success to see which offline number predicts it."""
    report = _read(RunFolder(train_dir).report())
    if not isinstance(report, dict) or not isinstance(report.get("policy"), dict):
        return None
    policy, baselines = report["policy"], report.get("baselines") or {}
    per_step = policy.get("rmse_per_step") or [None]
    return {
        "rmse": policy.get("rmse"),  # normalised, over the chunk
        "first_action_rmse": per_step[0],  # the action a robot runs first
        "accuracy": policy.get("accuracy"),  # teacher-forced next-id accuracy
        "loss": policy.get("loss"),
        "tokens_per_chunk": policy.get("tokens_per_chunk"),
        "mean_action_rmse": (baselines.get("mean_action") or {}).get("rmse"),
        "hold_state_rmse": (baselines.get("hold_state") or {}).get("rmse"),
    }


def _episodes(report: dict[str, Any]) -> tuple[list[bool], list[int] | None, dict[str, list[bool]] | None]:
    """Every evaluation episode's success and seed, a multi-task evaluation's tasks one after another in their order,
    and (multi-task only) the successes by short task name."""
    if "tasks" not in report:
        return [bool(x) for x in report["successes"]], report.get("seeds"), None
    per_task = {name.split("/")[-1]: [bool(x) for x in t["successes"]] for name, t in report["tasks"].items()}
    seeds = [seed for t in report["tasks"].values() for seed in t.get("seeds", [])] or None
    return [x for task in per_task.values() for x in task], seeds, per_task


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_results_folder(study: Study, results: Path, summary: dict[str, Any] | None) -> None:
    """Refuse a results folder that is not this study's: another study's ``runs.json``, or pages with no
    ``runs.json`` beside them (a project's README), which ``vla study run`` would write over."""
    if summary is not None:
        name = summary["study"].get("name")
        if name != study.name:
            raise ValueError(
                f"{results / RUNS_FILE} holds study {name!r}, not {study.name!r}; give this study its "
                f"own folder (--results results/{study.name})"
            )
        return
    found = [p for p in PAGES if (results / p).exists()]
    if found:
        raise ValueError(
            f"{results} holds {found[0]} but no {RUNS_FILE}, so it is not a study's results folder and "
            f"would be written over; pass --results results/{study.name} or an empty folder"
        )


def check_training_arguments(study: Study, runs: list[Run]) -> None:
    """Each run's ``vla train`` arguments parsed as ``vla train`` will, before anything trains: a misspelt option or
    a bad value is named now, and the runner's own settings (dataset, seed, output folder) must come through."""
    from vla.train_cli import parse_args

    if not Path(study.config).is_file():
        raise FileNotFoundError(f"the study's config {study.config} does not exist; fix 'config' in {study.path}")
    for run in runs:
        args = train_command(study, run, Path("study-output"))[4:]
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):  # draccus prints its usage before it exits
                cfg = parse_args(args)
        except SystemExit:
            lines = errors.getvalue().strip().splitlines() or ["error: unreadable"]
            reason = lines[-1].split("error: ", 1)[-1]
        except (ValueError, OSError) as err:
            reason = str(err)
        else:
            reason = None
        if reason is not None:
            raise ValueError(f"run {run.id}: its vla train arguments do not parse ({reason}); fix {study.path}")
        got = (str(cfg.dataset_root), int(cfg.seed), str(cfg.output_dir), bool(cfg.resume) or bool(cfg.overwrite))
        if got != (study.dataset, run.seed, str(Path("study-output") / "train"), False):
            raise ValueError(
                f"run {run.id}: its arguments {list(run.overrides)} change the dataset, seed or folder "
                f"the runner sets; remove that argument from {study.path}"
            )


def _refuse_changed(study: Study, status: Plan, rerun_changed: bool) -> None:
    if status.changed and not rerun_changed:
        first = next(iter(status.changed))
        raise ValueError(
            f"run {first}: {status.changed[first]} in {study.path} since it ran ({len(status.changed)} "
            "changed run(s)); restore the study file, or pass --rerun-changed to train and evaluate them "
            "again (their old records are kept)"
        )


def run_study(
    study: Study,
    *,
    work: Path | None = None,
    results: Path | None = None,
    allow_dirty: bool = False,
    rerun_changed: bool = False,
    progress: bool = True,
    log=print,
) -> dict[str, Any]:
    """Train and evaluate every run not yet finished, ``study.workers`` at a time; returns the aggregated results
    (also written to ``results/<name>/``). One study run per work folder at a time (``study.lock``); its child
    processes end with it. A finished run whose settings the study file has changed is refused, or trained again
    with ``rerun_changed`` (its old record kept in ``earlier_runs``, its old folder moved aside)."""
    work = Path(work or Path("outputs/studies") / study.name)
    results = Path(results or Path("results") / study.name)
    commit, dirty = git_state()
    if dirty and not allow_dirty:
        raise RuntimeError(
            "the code has uncommitted changes, so the study's runs could not be traced to a commit; "
            "commit them first, or pass --allow-dirty (each run then records dirty: true)"
        )
    check_training_arguments(study, study.runs())
    check_results_folder(study, results, read_runs(results / RUNS_FILE))
    _refuse_changed(study, plan(study, work, results), rerun_changed)  # before the lock creates the work folder
    with StudyLock(work, log) as lock, _results_lock(results, work, log), Children(lock) as children:
        return _run_locked(study, work, results, commit, dirty, rerun_changed, progress, log, lock, children)


def _results_lock(results: Path, work: Path, log) -> contextlib.AbstractContextManager:
    """The results folder held too (two study runs with their own work folders would write one runs.json)."""
    same = results.resolve() == work.resolve()
    return contextlib.nullcontext() if same else StudyLock(results, log)


def _run_locked(study, work, results, commit, dirty, rerun_changed, progress, log, lock, children) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from vla.study.report import write_results

    status = plan(study, work, results)
    _refuse_changed(study, status, rerun_changed)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for run_id in status.stale_folders:
        aside = work / f"{run_id}.changed-{stamp}"
        (work / run_id).rename(aside)
        log(f"run {run_id}: {status.changed[run_id]}; its old folder is kept as {aside}")
    if len(study.seeds) < MIN_SEEDS:
        log(f"warning: {len(study.seeds)} training seed(s); a verdict needs at least {MIN_SEEDS}")
    root = ensure_dataset(study, log, children)
    fingerprint = dataset_fingerprint(root)
    runs = study.runs()
    for record in status.done.values():
        sha = (record.get("provenance") or {}).get("dataset", {}).get("sha256")
        if sha not in (None, fingerprint.get("sha256")):
            log(
                f"warning: run {record['id']} was trained on a dataset with sha256 {sha[:12]}, not this one "
                f"({str(fingerprint.get('sha256'))[:12]}); its cell mixes data, and the page says so"
            )
    todo = status.todo
    log(
        f"study {study.name}: {len(runs)} runs ({len(status.done)} finished, {len(status.changed)} changed), "
        f"{study.workers} at a time, {study.threads} thread(s) each; commit {commit[:10]}{' (dirty)' if dirty else ''}"
        f"; logs in {work}/<run>/log.txt"
    )

    def table() -> dict[str, Any]:
        now = plan(study, work, results).shown
        return write_results(study, [now[r.id] for r in runs if r.id in now], results, fingerprint)

    failures: list[str] = []
    bar = tqdm(total=len(runs), initial=len(status.done), desc=f"study {study.name}", unit="run", disable=not progress)
    pool = ThreadPoolExecutor(max_workers=study.workers)
    try:
        futures = {pool.submit(execute, study, run, work / run.id, fingerprint, children): run for run in todo}
        for future in as_completed(futures):
            run = futures[future]
            try:
                record = future.result()
                bar.set_postfix_str(f"{run.id}: {record['success_rate']:.0%}")
            except Stopped:
                raise
            except (RuntimeError, OSError, ValueError, KeyError) as err:
                failures.append(str(err) if str(err).startswith(f"run {run.id}:") else f"run {run.id}: {err}")
                log(f"run {run.id} failed: {err}")
            bar.update(1)
            table()
    except BaseException:
        children.end_all()  # a stopped or failing study leaves nothing running
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    summary = table()
    if failures:
        raise RuntimeError(
            f"{len(failures)} run(s) failed ({'; '.join(failures)}); fix the cause and run the "
            "same command again: finished runs are kept"
        )
    return summary
