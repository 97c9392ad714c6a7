"""What a closed-loop study is: a grid of settings x tokenizers x training seeds over one dataset, each run trained
by ``vla train`` and evaluated by ``vla eval``. Read from a YAML file (``configs/studies/*.yaml``):

    name: push_pixels                      # results/<name>/ and outputs/studies/<name>/
    question: Which tokenizer acts best from pixels?   # the head of results/<name>/README.md
    dataset: outputs/datasets/metaworld_push-v3_pixels
    record: [--task, push-v3, --episodes, "200", --images, ...]    # `vla data record` arguments when it is missing
    config: configs/images.yaml            # the base training config
    train: [--steps=4000]                  # overrides every run gets
    settings: {4k: []}                     # named override lists (one grid axis)
    tokenizers: {fast: [--tokenizer.type=fast], beast: [--tokenizer.type=beast, --tokenizer.n_control_points=6]}
    seeds: [0, 1, 2]                       # training seeds (--seed), at least 3 for a verdict
    eval: {env: metaworld, task: push-v3, episodes: 100, args: [--num-envs, "10"]}
    workers: 2                             # runs side by side
    threads: 1                             # torch threads per run

Every run is named ``<setting>-<tokenizer>-s<seed>``; its overrides are the base ``train`` list, then the setting's,
then the tokenizer's, then ``--seed`` and ``--output_dir`` (later ones win, as on draccus' command line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MIN_SEEDS = 3  # fewer gives a number, not a verdict: the runner warns
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")


@dataclass(frozen=True)
class Run:
    """One training seed of one grid cell."""

    setting: str
    tokenizer: str
    seed: int
    overrides: tuple[str, ...]  # vla train arguments after --config_path, --seed and --output_dir excluded

    @property
    def id(self) -> str:
        return f"{self.setting}-{self.tokenizer}-s{self.seed}"


@dataclass(frozen=True)
class Study:
    name: str
    dataset: str
    config: str
    tokenizers: dict[str, list[str]]
    seeds: list[int]
    eval: dict[str, Any]
    settings: dict[str, list[str]] = field(default_factory=lambda: {"default": []})
    train: list[str] = field(default_factory=list)
    record: list[str] | None = None
    workers: int = 2
    threads: int = 1
    question: str = ""  # what the study asks, in a sentence: the head of results/<name>/README.md
    path: str | None = None  # the YAML it was read from

    def runs(self) -> list[Run]:
        """Every run, seed-major (all cells' seed 0 first), so a stopped study has every cell's first seeds."""
        return [
            Run(setting, tok, seed, tuple(self.train) + tuple(s_args) + tuple(t_args))
            for seed in self.seeds
            for setting, s_args in self.settings.items()
            for tok, t_args in self.tokenizers.items()
        ]


def load_study(path: str | Path) -> Study:
    """Read and check a study file; every problem is one line naming the key and the fix."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no study file {path}; see configs/studies/ for examples") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML ({str(err).splitlines()[0]}); fix the file") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping of study keys (name, dataset, config, tokenizers, seeds, eval)")
    known = set(Study.__dataclass_fields__) - {"path"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; a study has {sorted(known)}")
    missing = [k for k in ("name", "dataset", "config", "tokenizers", "seeds", "eval") if k not in raw]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing}")

    def check(ok: bool, key: str, fix: str) -> None:
        if not ok:
            raise ValueError(f"{path}: '{key}' = {raw.get(key)!r} is invalid: {fix}")

    check(isinstance(raw.get("question", ""), str), "question", "one sentence of text")
    check(isinstance(raw["name"], str) and bool(_NAME.match(raw["name"])), "name", "use letters, digits, '_' or '.'")
    for key in ("tokenizers", "settings"):
        if key in raw:
            value = raw[key]
            check(isinstance(value, dict) and bool(value) and all(
                isinstance(k, str) and _NAME.match(k) and "-" not in k and isinstance(v, list | type(None))
                for k, v in value.items()
            ), key, "a mapping of names (letters, digits, '_') to lists of vla train arguments")  # fmt: skip
            raw[key] = {k: [str(a) for a in (v or [])] for k, v in value.items()}
    seeds = raw["seeds"]
    check(isinstance(seeds, list) and bool(seeds) and all(isinstance(s, int) for s in seeds)
          and len(set(seeds)) == len(seeds), "seeds", "a list of distinct integers, e.g. [0, 1, 2]")  # fmt: skip
    ev = raw["eval"]
    check(isinstance(ev, dict) and isinstance(ev.get("episodes"), int) and ev["episodes"] >= 1, "eval",
          "a mapping with env, task, episodes (>= 1) and optional args (a list of vla eval arguments)")  # fmt: skip
    ev.setdefault("env", "metaworld")
    ev.setdefault("task", "push-v3")
    ev["args"] = [str(a) for a in ev.get("args") or []]
    for key in ("workers", "threads"):
        check(isinstance(raw.get(key, 1), int) and raw.get(key, 1) >= 1, key, "a positive integer")
    for key in ("train", "record"):
        check(raw.get(key) is None or isinstance(raw[key], list), key, "a list of command-line arguments")
        if raw.get(key) is not None:
            raw[key] = [str(a) for a in raw[key]]
    for args in [*raw["tokenizers"].values(), *raw.get("settings", {}).values(), raw.get("train") or []]:
        bad = [a for a in args if a.split("=")[0] in ("--seed", "--output_dir", "--config_path", "--resume")]
        if bad:
            raise ValueError(f"{path}: {bad[0].split('=')[0]} is set by the study runner for every run; remove it")
    return Study(**raw, path=str(path))
