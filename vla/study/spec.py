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

MAX_SEED = 2**32 - 1  # numpy's and torch's seeding take a 32-bit unsigned integer
MAX_EPISODES = 100_000  # evaluation episodes per task and run
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*$")  # never "." or "..": a name is a folder under results/ and work/
REQUIRED = ("name", "dataset", "config", "tokenizers", "seeds", "eval")
EVAL_KEYS = ("env", "task", "episodes", "args")
# The runner writes these itself for every run: a study that set them would record one thing and run another.
TRAIN_OWNED = ("--seed", "--output_dir", "--config_path", "--resume", "--overwrite", "--dataset_root")
EVAL_OWNED = ("--policy", "--env", "--task", "--episodes", "--out")


def eval_arguments(ev: dict[str, Any], policy: str, out: str) -> list[str]:
    """``vla eval``'s arguments for a study's evaluation ``ev`` (``EVAL_KEYS``): the runner's own (``EVAL_OWNED``, in
    that order), then the study's ``args``."""
    owned = (policy, ev["env"], ev["task"], str(ev["episodes"]), out)
    return [word for flag, value in zip(EVAL_OWNED, owned) for word in (flag, value)] + list(ev["args"])


def read_eval_arguments(words: list[str]) -> dict[str, Any] | None:
    """The evaluation (``EVAL_KEYS``) that ``eval_arguments`` spelled as ``words``; None when they do not begin with
    the runner's own flags in their order."""
    n = 2 * len(EVAL_OWNED)
    if words[:n:2] != list(EVAL_OWNED) or len(words) < n:
        return None
    value = dict(zip(words[:n:2], words[1:n:2]))
    episodes = value["--episodes"]
    return {
        "env": value["--env"],
        "task": value["--task"],
        "episodes": int(episodes) if episodes.isdigit() else episodes,
        "args": words[n:],
    }


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


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class names it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping; keep one", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def load_study(path: str | Path) -> Study:
    """Read and check a study file; every problem is one line naming the key and the fix."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except FileNotFoundError:
        raise FileNotFoundError(f"no study file {path}; see configs/studies/ for examples") from None
    except yaml.YAMLError as err:
        where = f" at line {err.problem_mark.line + 1}" if getattr(err, "problem_mark", None) else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML{where} ({what}); fix the file") from None
    return check_study(raw, str(path))


def check_study(raw: Any, where: str, path: str | None = None) -> Study:
    """A study from a mapping (a study file's, or the block a ``runs.json`` holds), every value checked before anything
    runs; ``where`` names the source in the messages."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must hold a mapping of study keys ({', '.join(REQUIRED)})")
    raw = dict(raw)
    known = set(Study.__dataclass_fields__) - {"path"}
    unknown = sorted(str(k) for k in set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a study has {sorted(known)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")

    def check(ok: bool, key: str, fix: str) -> None:
        if not ok:
            raise ValueError(f"{where}: '{key}' = {raw.get(key)!r} is invalid: {fix}")

    check(isinstance(raw.get("question", ""), str), "question", "one sentence of text")
    check(
        isinstance(raw["name"], str) and bool(_NAME.match(raw["name"])),
        "name",
        "start with a letter or digit, then letters, digits, '_' or '.' (it names folders)",
    )
    for key in ("dataset", "config"):
        check(isinstance(raw[key], str) and bool(raw[key].strip()), key, "a path, as text")
    for key in ("tokenizers", "settings"):
        if key in raw:
            value = raw[key]
            check(
                isinstance(value, dict)
                and bool(value)
                and all(
                    isinstance(k, str) and _NAME.match(k) and isinstance(v, list | type(None)) for k, v in value.items()
                ),
                key,
                "a mapping of names (letters, digits, '_') to lists of vla train arguments",
            )
            raw[key] = {k: [_arg(a, where, key) for a in (v or [])] for k, v in value.items()}
    seeds = raw["seeds"]
    check(
        isinstance(seeds, list) and bool(seeds) and all(_seed(s) for s in seeds) and len(set(seeds)) == len(seeds),
        "seeds",
        f"a list of distinct integers from 0 to {MAX_SEED}, e.g. [0, 1, 2]",
    )
    raw["eval"] = check_eval(raw["eval"], where)
    for key in ("workers", "threads"):
        value = raw.get(key, 1)
        check(
            isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256,
            key,
            "a positive integer (at most 256)",
        )
    for key in ("train", "record"):
        check(raw.get(key) is None or isinstance(raw[key], list), key, "a list of command-line arguments")
        if raw.get(key) is not None:
            raw[key] = [_arg(a, where, key) for a in raw[key]]
    lists = {
        **{f"tokenizers.{k}": v for k, v in raw["tokenizers"].items()},
        **{f"settings.{k}": v for k, v in raw.get("settings", {}).items()},
        "train": raw.get("train") or [],
    }
    for key, args in lists.items():
        owned = [a for a in args if _flag(a) in TRAIN_OWNED]
        if owned:
            raise ValueError(
                f"{where}: {key}: {_flag(owned[0])} is set by the study runner for every run (the "
                f"study's own dataset, seeds and folders); remove {owned[0]!r}"
            )
    return Study(**raw, path=path if path is not None else where)


def check_eval(ev: Any, where: str) -> dict[str, Any]:
    """The ``eval`` block: known keys only, an environment and tasks that exist, ``vla eval`` arguments it accepts
    and none of the ones the runner sets (policy, environment, task, episodes, output folder)."""
    if not isinstance(ev, dict):
        raise ValueError(f"{where}: 'eval' = {ev!r} is invalid: a mapping with env, task, episodes and args")
    unknown = sorted(str(k) for k in set(ev) - set(EVAL_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} in 'eval'; it has {list(EVAL_KEYS)}")
    episodes = ev.get("episodes")
    if not (isinstance(episodes, int) and not isinstance(episodes, bool) and 1 <= episodes <= MAX_EPISODES):
        raise ValueError(f"{where}: 'eval' episodes {episodes!r} is invalid: an integer from 1 to {MAX_EPISODES}")
    out = {"env": ev.get("env", "metaworld"), "task": ev.get("task", "push-v3"), "episodes": episodes}
    for key in ("env", "task"):
        if not isinstance(out[key], str) or not out[key]:
            raise ValueError(f"{where}: 'eval.{key}' = {out[key]!r} is invalid: a name, as text")
    from vla.sim import env_names

    try:
        env_names(f"{out['env']}/{out['task']}")
    except (ValueError, KeyError) as err:
        raise ValueError(f"{where}: eval env {out['env']!r} task {out['task']!r}: {err}") from None
    if not isinstance(ev.get("args") or [], list):
        raise ValueError(f"{where}: 'eval.args' = {ev.get('args')!r} is invalid: a list of vla eval arguments")
    out["args"] = [_arg(a, where, "eval.args") for a in ev.get("args") or []]
    _check_eval_args(out, where)
    return out


def _check_eval_args(ev: dict[str, Any], where: str) -> None:
    """``vla eval``'s own parser reads the arguments with the runner's placed first: an unknown one, a bad value, or
    one that replaces the runner's own is refused now, not after every run has trained."""
    import contextlib
    import io

    owned = [a for a in ev["args"] if _flag(a) in EVAL_OWNED]
    if owned:
        raise ValueError(
            f"{where}: eval.args: {_flag(owned[0])} is set by the study runner (the run's policy, the "
            f"study's env, task, episodes and folder); remove {owned[0]!r}"
        )
    from vla.cli import build_parser

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args, extra = build_parser(["eval"]).parse_known_args(["eval", *eval_arguments(ev, "P", "O")])
    except SystemExit:
        reason = (errors.getvalue().strip().splitlines() or ["unreadable"])[-1].split("error: ")[-1]
        raise ValueError(f"{where}: eval.args {ev['args']} are not vla eval arguments ({reason}); see vla eval --help")
    if extra:
        raise ValueError(f"{where}: eval.args: {extra[0]!r} is no vla eval argument; see vla eval --help")
    if str(args.policy) != "P" or str(args.out) != "O":
        raise ValueError(f"{where}: eval.args {ev['args']} set the policy or output folder, which the runner sets")


def _arg(value: Any, where: str, key: str) -> str:
    """One command-line argument as text: a string or a number (YAML reads "200" unquoted as one), nothing else."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f'{where}: {key}: argument {value!r} is not a command-line word; quote it, e.g. "--steps=5"')
    return str(value)


def _flag(arg: str) -> str:
    """``--output-dir=x`` -> ``--output_dir``: the flag an argument sets, in draccus' spelling."""
    return arg.split("=", 1)[0].replace("-", "_").replace("__", "--", 1) if arg.startswith("--") else ""


def _seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED
