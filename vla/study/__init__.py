"""Closed-loop studies: settings x tokenizers x training seeds, each trained and evaluated, aggregated into a mean
over seeds with its spread and an interval, every run traceable to what produced it.

    study = load_study("configs/studies/push_pixels.yaml")
    summary = run_study(study)          # resumable; writes results/<name>/runs.json, README.md, success.png
"""

from vla.study.runner import run_study
from vla.study.spec import Run, Study, load_study
from vla.study.stats import aggregate, compare, wilson

__all__ = ["Run", "Study", "aggregate", "compare", "load_study", "run_study", "wilson"]
