"""What a study run executes and what produced it: its ``vla train`` and ``vla eval`` commands and its ``identity``
(the training command without the output folder, the base config's content, the evaluation, the threads), which
the runner writes and checks and the report compares against a study file."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from vla.provenance import portable_command
from vla.run_folder import StudyRunFolder
from vla.study.records import without_output_dir
from vla.study.spec import EVAL_KEYS, Run, Study, eval_arguments


def vla_command(*args: str) -> list[str]:
    """This Python running ``vla`` with ``args``: the same environment as the study."""
    return [sys.executable, "-m", "vla.cli", *args]


def train_command(study: Study, run: Run, folder: Path) -> list[str]:
    """``vla train`` for one run (``execute`` adds ``--resume=true`` when the run has a checkpoint)."""
    return vla_command(
        "train",
        "--config_path",
        study.config,
        f"--dataset_root={study.dataset}",
        *run.overrides,
        f"--seed={run.seed}",
        f"--output_dir={StudyRunFolder(folder).train.path}",
        "--progress=false",
    )


def eval_command(study: Study, folder: Path) -> list[str]:
    return vla_command(
        "eval", *eval_arguments(study.eval, str(StudyRunFolder(folder).train.policy), str(StudyRunFolder(folder).eval))
    )


def config_digest(path: str | Path) -> str | None:
    """The sha256 of a YAML config's content (its values, not its comments or layout); None when it is missing."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    try:
        canonical = json.dumps(yaml.safe_load(text), sort_keys=True, default=str)
    except yaml.YAMLError:
        canonical = text
    return hashlib.sha256(canonical.encode()).hexdigest()


def identity(study: Study, run: Run) -> dict[str, Any]:
    """What produces a run: its full training command (the output folder left out), the base config's content, the
    evaluation and the torch threads. A finished run counts for the study only while this has not changed."""
    command = ["vla", *train_command(study, run, Path("."))[3:]]
    return {
        "train": without_output_dir(portable_command(command)),
        "config": study.config,
        "config_sha256": config_digest(study.config),
        "eval": {k: study.eval[k] for k in EVAL_KEYS},
        "threads": study.threads,
    }
