"""Run a closed-loop study (``vla.study.spec``): every run trained and evaluated in its own process, ``workers`` at a
time with ``threads`` torch threads each, resumable, every finished run recorded with what produced it.

    vla study run configs/studies/push_pixels.yaml     # trains + evaluates what is not done yet, then the table
    vla study table results/push_pixels                # the README and plot again from runs.json

Layout: ``outputs/studies/<name>/<run id>/`` holds each run's training folder (``train/``), its evaluation
(``eval/eval_info.json``), its log and, once finished, ``run.json``; ``results/<name>/`` holds ``runs.json`` (every
finished run: its full training config, commit, dataset fingerprint, threads, package versions, wall times and
per-episode successes), ``README.md`` (question, command, table) and ``success.png`` (``vla.study.report``), rewritten after every run.

A killed study continues where it stopped: finished runs (``run.json``, or their record in ``results/<name>/runs.json``
when the work folder is gone) are kept, a training with checkpoints is
resumed from its last one (``--resume=true``, exact), one killed before its first checkpoint starts again, and an
evaluation is redone when its ``eval_info.json`` is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from vla.io import write_json
from vla.provenance import dataset_fingerprint, git_state, provenance
from vla.study.spec import MIN_SEEDS, Run, Study

RUN_FILE = "run.json"
RUNS_FILE = "runs.json"


def _python(*args: str) -> list[str]:
    return [sys.executable, "-m", "vla.cli", *args]


def ensure_dataset(study: Study, log=print) -> Path:
    """The study's dataset, recorded with ``study.record`` when it is missing."""
    root = Path(study.dataset)
    if (root / "meta" / "info.json").is_file():
        return root
    if study.record is None:
        raise FileNotFoundError(f"the study's dataset {root} does not exist and the study has no 'record' arguments; "
                                "record it first or add `record: [...]` (vla data record arguments)")  # fmt: skip
    log(f"recording the study's dataset into {root}")
    subprocess.run(_python("data", "record", *study.record, "--root", str(root), "--quiet"), check=True)
    return root


def train_command(study: Study, run: Run, folder: Path) -> list[str]:
    """``vla train`` for one run (``execute`` adds ``--resume=true`` when the run has a checkpoint)."""
    return _python("train", "--config_path", study.config, f"--dataset_root={study.dataset}", *run.overrides,
                   f"--seed={run.seed}", f"--output_dir={folder / 'train'}", "--progress=false")  # fmt: skip


def _resumable(cmd: list[str], train_dir: Path) -> list[str]:
    """Resume from the last checkpoint; a training killed before its first one starts again (nothing to keep)."""
    if any((train_dir / "checkpoints").glob("step_*")):
        return [*cmd, "--resume=true"]
    if train_dir.exists():
        shutil.rmtree(train_dir)
    return cmd


def eval_command(study: Study, folder: Path) -> list[str]:
    ev = study.eval
    return _python("eval", "--policy", str(folder / "train" / "policy"), "--env", ev["env"], "--task", ev["task"],
                   "--episodes", str(ev["episodes"]), "--out", str(folder / "eval"), *ev["args"])  # fmt: skip


def _final_loss(train_dir: Path) -> float | None:
    lines = (train_dir / "metrics.jsonl").read_text().splitlines() if (train_dir / "metrics.jsonl").is_file() else []
    losses = [json.loads(line).get("loss") for line in lines if line.strip()]
    losses = [x for x in losses if x is not None]
    return float(losses[-1]) if losses else None


def execute(study: Study, run: Run, folder: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Train (or resume) and evaluate one run in child processes, then write its ``run.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(study.threads), "MKL_NUM_THREADS": str(study.threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    walls: dict[str, float] = _read(folder / "walls.json") or {}  # seconds per stage, summed over resumes
    with (folder / "log.txt").open("a") as log:
        for stage in ("train", "eval"):
            if stage == "train" and (folder / "train" / "policy").is_dir():
                continue
            if stage == "eval" and (folder / "eval" / "eval_info.json").is_file():
                continue
            if stage == "train":
                cmd = _resumable(train_command(study, run, folder), folder / "train")
            else:
                cmd = eval_command(study, folder)
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            start = time.perf_counter()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            walls[stage] = walls.get(stage, 0.0) + time.perf_counter() - start
            write_json(folder / "walls.json", walls)
            if done.returncode != 0:
                raise RuntimeError(f"run {run.id}: {stage} failed (exit {done.returncode}); see {folder / 'log.txt'}")
    train_config = json.loads((folder / "train" / "train_config.json").read_text())
    report = json.loads((folder / "eval" / "eval_info.json").read_text())
    successes, seeds, per_task = _episodes(report)
    record = {
        "id": run.id,
        "setting": run.setting,
        "tokenizer": run.tokenizer,
        "seed": run.seed,
        "overrides": list(run.overrides),
        "successes": successes,
        "episode_seeds": seeds,
        **({"task_successes": per_task} if per_task else {}),
        "success_rate": report["success_rate"],
        "mean_length": report.get("mean_length"),
        "tokens_per_chunk": report.get("tokens_per_chunk"),
        "valid_chunk_rate": report.get("valid_chunk_rate"),
        "latency_ms_mean": report.get("latency_ms_mean"),
        "final_loss": _final_loss(folder / "train"),
        "train_wall_s": walls.get("train"),
        "eval_wall_s": walls.get("eval"),
        # The command that reproduces the run's training (its evaluation: study.eval).
        "provenance": provenance(config=train_config, fingerprint=fingerprint, threads=study.threads,
                                 workers=study.workers, command=["vla", *train_command(study, run, folder)[3:]]),
    }
    write_json(folder / RUN_FILE, record)
    return record


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


def finished(study: Study, work: Path, results: Path | None = None) -> list[dict[str, Any]]:
    """The finished runs of ``study``, in the study's order: each run's ``run.json`` under ``work``, else, when the
    run has no folder there (a study continued on another machine), its record in ``results/runs.json``, which counts
    only while it was trained with the run's own arguments and seed."""
    reported = _read(results / RUNS_FILE) if results is not None else None
    by_id = {r.get("id"): r for r in (reported or {}).get("runs", []) if isinstance(r, dict)}
    records = []
    for run in study.runs():
        record = _read(work / run.id / RUN_FILE)
        if record is None and run.id in by_id and not (work / run.id).exists():
            old = by_id[run.id]
            if old.get("seed") == run.seed and old.get("overrides") == list(run.overrides):
                record = old
        if record is not None:
            records.append(record)
    return records


def run_study(
    study: Study,
    *,
    work: Path | None = None,
    results: Path | None = None,
    allow_dirty: bool = False,
    progress: bool = True,
    log=print,
) -> dict[str, Any]:
    """Train and evaluate every run not yet finished, ``study.workers`` at a time; returns the aggregated results
    (also written to ``results/<name>/``)."""
    from tqdm.auto import tqdm

    from vla.study.report import write_results

    work = Path(work or Path("outputs/studies") / study.name)
    results = Path(results or Path("results") / study.name)
    commit, dirty = git_state()
    if dirty and not allow_dirty:
        raise RuntimeError("the code has uncommitted changes, so the study's runs could not be traced to a commit; "
                           "commit them first, or pass --allow-dirty (each run then records dirty: true)")  # fmt: skip
    if len(study.seeds) < MIN_SEEDS:
        log(f"warning: {len(study.seeds)} training seed(s); a verdict needs at least {MIN_SEEDS}")
    root = ensure_dataset(study, log)
    fingerprint = dataset_fingerprint(root)
    runs = study.runs()
    kept = finished(study, work, results)
    done = {r["id"] for r in kept}
    for record in kept:
        sha = (record.get("provenance") or {}).get("dataset", {}).get("sha256")
        if sha not in (None, fingerprint.get("sha256")):
            log(f"warning: run {record['id']} was trained on a dataset with sha256 {sha[:12]}, not this one "
                f"({str(fingerprint.get('sha256'))[:12]}); its cell mixes data")  # fmt: skip
    todo = [run for run in runs if run.id not in done]
    log(f"study {study.name}: {len(runs)} runs ({len(done)} finished), {study.workers} at a time, "
        f"{study.threads} thread(s) each; commit {commit[:10]}{' (dirty)' if dirty else ''}; logs in {work}/<run>/log.txt")  # fmt: skip
    failures: list[str] = []
    bar = tqdm(total=len(runs), initial=len(done), desc=f"study {study.name}", unit="run", disable=not progress)
    with ThreadPoolExecutor(max_workers=study.workers) as pool:
        futures = {pool.submit(execute, study, run, work / run.id, fingerprint): run for run in todo}
        for future in as_completed(futures):
            run = futures[future]
            try:
                record = future.result()
                bar.set_postfix_str(f"{run.id}: {record['success_rate']:.0%}")
            except (RuntimeError, OSError, ValueError, KeyError) as err:
                failures.append(f"{run.id}: {err}")
                log(f"run {run.id} failed: {err}")
            bar.update(1)
            write_results(study, finished(study, work, results), results, fingerprint)
    bar.close()
    summary = write_results(study, finished(study, work, results), results, fingerprint)
    if failures:
        raise RuntimeError(f"{len(failures)} run(s) failed ({'; '.join(failures)}); fix the cause and run the "
                           "same command again: finished runs are kept")  # fmt: skip
    return summary
