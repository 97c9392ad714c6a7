"""A study's records, read through one checked reader and only ever added to.

    summary = read_runs(results / "runs.json")     # None when absent; a one-line ValueError when unreadable
    record = read_record(work / run_id / "run.json")
    backup = write_runs(results / "runs.json", summary)   # a dated copy beside it first, if a record would change

``runs.json`` holds ``runs`` (the runs the study file produces, each finished) and ``earlier_runs`` (records kept
from earlier versions of the study file: a seed removed, a run trained again after its settings changed). A record
is never dropped: it moves to ``earlier_runs``, and before a rewrite changes or moves one, the file is copied to
``runs.json.<UTC time>.bak`` beside it. A file that cannot be read is refused, never replaced.

A run's ``identity`` is what produced it (``vla.study.commands.identity``): its training command without the output
folder, the base config's content, the evaluation and the threads. ``changes`` names the first difference between
a record's and the study file's; a record from before identities existed is matched by what it holds (its
``provenance.command``, threads, and the evaluation in the study block of its ``runs.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from vla.io import write_json
from vla.study.spec import EVAL_KEYS, MAX_EPISODES, MAX_SEED, check_study

FORMAT = 1
RUNS_FILE = "runs.json"
_RESTORE = "restore it (git checkout, or the newest runs.json.*.bak beside it) or move it aside"


_REDO = "delete it: the next run of the study writes it again from the run folder (its evaluation, if eval_info.json is gone)"


def _load(path: Path, what: str, fix: str = _RESTORE) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} ({what}) cannot be read ({str(err).splitlines()[0]}); {fix}") from None


def check_record(record: Any, where: str, fix: str = _RESTORE) -> dict[str, Any]:
    """One run's record, as ``vla study run`` writes it: a one-line ``ValueError`` names what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a run record must be a JSON object, got {type(record).__name__}; {fix}")

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ValueError(
                f"{where}: run {record.get('id', '?')!r}: '{key}' = {_short(record.get(key))} is not {what}; {fix}"
            )

    for key in ("id", "setting", "tokenizer"):
        need(isinstance(record.get(key), str) and bool(record.get(key)), key, "a name")
    seed = record.get("seed")
    need(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED, "seed", "a training seed")
    need(_episodes(record.get("successes")), "successes", "a list of true/false, one per evaluation episode")
    tasks = record.get("task_successes")
    need(
        tasks is None
        or (isinstance(tasks, dict) and all(isinstance(k, str) and _episodes(v) for k, v in tasks.items())),
        "task_successes",
        "a mapping of task names to lists of true/false",
    )
    need(isinstance(record.get("overrides", []), list), "overrides", "a list of vla train arguments")
    need(isinstance(record.get("provenance", {}), dict), "provenance", "a provenance block")
    need(isinstance(record.get("identity", {}), dict), "identity", "what produced the run")
    return record


def _episodes(value: Any) -> bool:
    return isinstance(value, list) and 0 < len(value) <= 64 * MAX_EPISODES and all(isinstance(x, bool) for x in value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_record(path: Path) -> dict[str, Any] | None:
    """A run folder's ``run.json`` (None when the run has not finished)."""
    if not path.exists():
        return None
    return check_record(_load(path, "a finished run's record", _REDO), str(path), _REDO)


def read_runs(path: Path) -> dict[str, Any] | None:
    """A study's ``runs.json``, checked (None when there is none): its study block, every record, no id twice."""
    path = Path(path)
    if not path.exists():
        return None
    data = _load(path, "a study's records")
    if not isinstance(data, dict) or not isinstance(data.get("study"), dict) or not isinstance(data.get("runs"), list):
        raise ValueError(
            f"{path} is not a study's runs.json (it needs a 'study' block and a 'runs' list); give the "
            "results folder of a study that vla study run wrote"
        )
    if data.get("format") != FORMAT:
        raise ValueError(
            f"{path} has format {data.get('format')!r}, this version reads {FORMAT}; use the version "
            "of vla that wrote it"
        )
    check_study(data["study"], f"{path} (its study block)", path=data.get("study_file"))
    if not isinstance(data.get("earlier_runs", []), list):
        raise ValueError(f"{path}: 'earlier_runs' must be a list of run records; {_RESTORE}")
    seen: set[str] = set()
    for i, record in enumerate(data["runs"]):
        check_record(record, f"{path} runs[{i}]")
        if record["id"] in seen:
            raise ValueError(f"{path}: run {record['id']!r} is recorded twice in 'runs'; {_RESTORE}")
        seen.add(record["id"])
    for i, record in enumerate(data.get("earlier_runs", [])):
        check_record(record, f"{path} earlier_runs[{i}]")
    return data


def merged(old: dict[str, Any] | None, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``earlier_runs`` of a rewrite: the old file's, and every record of its ``runs`` that ``runs`` does not
    hold under the same id (a removed seed; a run superseded because what produced it changed)."""
    if old is None:
        return []
    earlier = list(old.get("earlier_runs", []))
    now = {r["id"]: r for r in runs}
    for record in old["runs"]:
        replaced = now.get(record["id"])
        if (replaced is None or not same_identity(record, replaced)) and record not in earlier:
            earlier.append(record)
    return earlier


def write_runs(path: Path, summary: dict[str, Any]) -> Path | None:
    """Write ``runs.json``; when a record of the old file would be changed or leave ``runs``, copy the old file to
    ``runs.json.<UTC time>.bak`` first and return that path."""
    old = read_runs(path)
    backup = None
    if old is not None:
        kept = all(r in summary["runs"] for r in old["runs"])
        kept = kept and all(r in summary.get("earlier_runs", []) for r in old.get("earlier_runs", []))
        if not kept:
            backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.bak")
            n = 1
            while backup.exists():
                backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{n}.bak")
                n += 1
            tmp = path.with_name(f".{backup.name}.tmp")
            shutil.copy2(path, tmp)
            os.replace(tmp, backup)
    write_json(path, summary)
    return backup


def legacy_identity(record: dict[str, Any], study_eval: dict[str, Any] | None) -> dict[str, Any]:
    """What a record written before identities existed says produced it: its training command (the output folder
    left out), its threads, and the evaluation its ``runs.json``'s study block names (None: not known)."""
    block = record.get("provenance") or {}
    command = block.get("command")
    out: dict[str, Any] = {}
    if isinstance(command, list):
        out["train"] = without_output_dir(command)
    if isinstance(block.get("threads"), int):
        out["threads"] = block["threads"]
    if isinstance(study_eval, dict):
        out["eval"] = {k: study_eval.get(k) for k in EVAL_KEYS}
    return out


def without_output_dir(command: list[str]) -> list[str]:
    """A ``vla train`` command without the arguments that say where it wrote and whether it resumed."""
    out, skip = [], False
    for arg in map(str, command):
        if skip:
            skip = False
            continue
        if arg in ("--output_dir", "--resume"):
            skip = True
            continue
        if arg.startswith(("--output_dir=", "--resume=")):
            continue
        out.append(arg)
    return out


def changes(had: dict[str, Any], wants: dict[str, Any]) -> str | None:
    """The first difference between what produced a run (``had``) and what the study file asks (``wants``), in
    words; None when every part ``had`` records agrees (a part it does not record cannot be compared)."""
    if "train" in had and had["train"] != wants["train"]:
        gone = [a for a in had["train"] if a not in wants["train"]]
        new = [a for a in wants["train"] if a not in had["train"]]
        if gone or new:
            return f"training arguments {' '.join(gone) or '(none)'} are now {' '.join(new) or '(none)'}"
        return f"training arguments are now in another order ({' '.join(wants['train'][2:])})"
    if "config_sha256" in had and had["config_sha256"] != wants["config_sha256"]:
        return f"the base config {wants['config']} has changed since it was trained"
    if "eval" in had and had["eval"] != wants["eval"]:
        key = next(k for k in EVAL_KEYS if had["eval"].get(k) != wants["eval"].get(k))
        return f"evaluation {key} {had['eval'].get(key)!r} is now {wants['eval'].get(key)!r}"
    if "threads" in had and had["threads"] != wants["threads"]:
        return f"threads {had['threads']} are now {wants['threads']}"
    return None


def same_identity(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records of one run id were produced alike (a record trained again by ``--rerun-changed`` is not:
    the old one stays in ``earlier_runs``)."""
    ia, ib = a.get("identity"), b.get("identity")
    if ia is None or ib is None:
        return (a.get("provenance") or {}).get("command") is None or without_output_dir(
            (a.get("provenance") or {}).get("command") or []
        ) == without_output_dir((b.get("provenance") or {}).get("command") or [])
    return changes(ia, ib) is None
