"""A training run's folder and the files in it, named once (the layout is in ``vla.checkpoints``): the trainer
writes them, and the study runner, the defaults (a resumed run's choices) and the evaluation (the run behind a policy)
read them through ``RunFolder``. A study run's work folder (``vla.study.runner``), which holds a training run and its
evaluation, is ``StudyRunFolder``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
LAST = "last.json"
STEP = "step_{:07d}"  # a checkpoint's folder under checkpoints/
TRAINER_STATE = (
    "trainer_state.json"  # in a checkpoint: its step and optimiser layout; written last, so it marks a whole one
)
CONFIG = "train_config.json"
DATASET = "dataset.json"  # the fingerprint of the data the run trains on: a resume refuses other data
METRICS = "metrics.jsonl"
POLICY = "policy"
LOSS_PLOT = "loss.png"
HELDOUT = "heldout.json"  # the run's held-out (and training) episode ids
HELDOUT_PLOT = "heldout.png"
REPORT = "offline_report"  # .json, .md, .png
EVAL_INFO = "eval_info.json"  # what `vla eval --out DIR` writes into DIR (a study run's eval/)
RUN_FILES = (
    CHECKPOINTS,
    CONFIG,
    DATASET,
    METRICS,
    POLICY,
    LOSS_PLOT,
    HELDOUT,
    HELDOUT_PLOT,
    f"{REPORT}.json",
    f"{REPORT}.md",
    f"{REPORT}.png",
)


@dataclass(frozen=True)
class RunFolder:
    """One training run's folder, its files named once."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def dataset(self) -> Path:
        return self.path / DATASET

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def policy(self) -> Path:
        return self.path / POLICY

    @property
    def loss_plot(self) -> Path:
        return self.path / LOSS_PLOT

    @property
    def heldout(self) -> Path:
        return self.path / HELDOUT

    @property
    def heldout_plot(self) -> Path:
        return self.path / HELDOUT_PLOT

    def report(self, suffix: str = ".json") -> Path:
        """The offline report: ``.json``, ``.md`` or ``.png``."""
        return self.path / f"{REPORT}{suffix}"

    def metrics_rows(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl``, oldest first (none when it is missing; a torn last line, left by a kill
        mid-write, is dropped)."""
        rows = []
        for line in self.metrics.read_text().splitlines() if self.metrics.is_file() else []:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def train_config(self) -> dict[str, Any] | None:
        """The run's ``train_config.json`` (None when it has none, or it cannot be read)."""
        try:
            config = json.loads(self.config.read_text())
        except (OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None

    def checkpoint(self, step: int) -> Path:
        """The folder of the checkpoint of ``step``."""
        return self.checkpoints / STEP.format(step)

    def saved_checkpoints(self) -> list[Path]:
        """The ``step_*`` checkpoint folders, oldest first."""
        return sorted(self.checkpoints.glob("step_*"))


@dataclass(frozen=True)
class StudyRunFolder:
    """One study run's work folder: its training run (``train/``), its evaluation (``eval/``, what ``vla eval --out``
    wrote), what produced it (``identity.json``, written before training starts), the log of both commands, their
    wall times, and once finished its record (``run.json``)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def train(self) -> RunFolder:
        return RunFolder(self.path / "train")

    @property
    def eval(self) -> Path:
        return self.path / "eval"

    @property
    def eval_info(self) -> Path:
        return self.eval / EVAL_INFO

    @property
    def identity(self) -> Path:
        return self.path / "identity.json"

    @property
    def log(self) -> Path:
        return self.path / "log.txt"

    @property
    def walls(self) -> Path:
        return self.path / "walls.json"  # seconds per stage (train, eval), summed over resumes

    @property
    def record(self) -> Path:
        return self.path / "run.json"
