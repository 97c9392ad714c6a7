"""The training configuration: one dataclass that holds the policy's (``VLAConfig``) and the tokenizer's, parsed by
draccus from ``configs/*.yaml`` (short diffs against the defaults) plus command-line overrides.

    vla train --config_path configs/debug.yaml --steps=100 --tokenizer.type=fast --tokenizer.scale=5 \\
        --policy.optimizer_lr=1e-3

The tokenizer choices are made from the tokenizer library's own registry (``action_tokenizers.TOKENIZERS``): each
tokenizer's ``Options`` dataclass becomes ``--tokenizer.type=<name>`` with the same fields and defaults, so a new
tokenizer needs no line here.

With no config file (``vla train --dataset_root DIR``) the run starts from ``vla.data.defaults.FROM_DATA``: the chunk
length, relative actions, state history, cameras and held-out split are chosen from the dataset when training starts
(each printed with its reason and saved in the run's train_config.json), and whatever is given on the command line
wins. A config file starts from the fixed defaults below; it writes ``null`` (or ``auto``) for a setting to be chosen.

draccus gotcha: a field of a choice type needs its ``type`` too on the command line (``--tokenizer.type=fast``
before ``--tokenizer.scale=5``), even when the YAML already chose it. A ``--tokenizer.type`` other than the YAML's
drops the YAML's tokenizer options (``configs/aloha.yaml --tokenizer.type=beast`` is BEAST with its defaults).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import action_tokenizers as at
import draccus
import yaml

from vla.data.reader import DatasetInfo
from vla.names import suggestion
from vla.policy.configuration_vla import VLAConfig
from vla.tokenizer_choice import DEFAULT_TOKENIZER, TokenizerConfig, tokenizer_config


# --- the run -------------------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    dataset_root: str = "outputs/datasets/metaworld_push-v3"  # a local LeRobot v3.0 dataset
    output_dir: str = "outputs/train/default"  # checkpoints, metrics.jsonl, loss.png, the final policy
    tokenizer: TokenizerConfig = field(default_factory=lambda: tokenizer_config(DEFAULT_TOKENIZER))
    # The policy, its optimiser and schedule (VLAConfig's fields: --policy.time_horizon=..., --policy.optimizer_lr=...).
    policy: VLAConfig = field(default_factory=VLAConfig)
    # share of episodes kept out of training (and out of tokenizer fitting); None: chosen when training starts (0.1)
    heldout_episodes: float | None = 0.0
    # Held-out measurement (vla.heldout), when heldout_episodes > 0: every eval_every steps (and at the end) on a fixed
    # subset of eval_chunks held-out chunks; at the end the offline report on report_chunks of them.
    eval_every: int = 250
    eval_chunks: int = 64
    report_chunks: int = 512
    steps: int = 3000  # optimiser steps
    # Sample every task (the dataset's LeRobot tasks: a multi-task recording's instructions) equally often, each frame
    # weighted by 1 / its task's frames; False: every frame equally, so tasks with long episodes dominate.
    balance_tasks: bool = False
    batch_size: int = 32  # samples per step, over all processes
    ema_decay: float = 0.999  # EMA of the weights; 0 turns it off. The final policy uses the EMA weights.
    save_every: int = 500  # checkpoint every this many steps (and at the end)
    keep_last: int = 3  # checkpoints kept (the newest); 0 keeps all
    log_every: int = 30  # steps between metrics lines (the only steps that wait for the device)
    num_workers: int = 0  # DataLoader workers: tokenising and packing run in them (0 = in the main process)
    mixed_precision: str = "auto"  # auto (bf16 on GPU, none on CPU), no, bf16, fp16
    seed: int = 0
    resume: bool = False  # continue from the last checkpoint in output_dir (with the run's own settings)
    overwrite: bool = False  # start fresh in an output_dir that holds a run, deleting that run
    progress: bool = True  # show a progress bar
    # What `vla train` chose from the dataset for the settings left unset, and why (written when training starts)
    chosen: dict[str, str] = field(default_factory=dict)
    # torch.compile the model's layers in the training step (vla.model.lean); falls back to uncompiled where it cannot compile
    compile: bool = False

    def resolved(self, info: DatasetInfo, log=print) -> TrainConfig:
        """This config with every unset setting chosen from the dataset, one printed line each (``vla.data.defaults``)."""
        from vla.data import defaults

        return defaults.resolve(self, info, log=log)

    def __post_init__(self) -> None:
        if self.mixed_precision in (False, "False", "false"):  # YAML reads a bare `--mixed_precision=no` as false
            self.mixed_precision = "no"
        checks = [
            (self.steps >= 1, f"steps must be >= 1, got {self.steps}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (0 <= self.ema_decay < 1, f"ema_decay must be in [0, 1), got {self.ema_decay}; use 0 to turn EMA off"),
            (self.save_every >= 1, f"save_every must be >= 1, got {self.save_every}"),
            (self.keep_last >= 0, f"keep_last must be >= 0 (0 keeps every checkpoint), got {self.keep_last}"),
            (self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}"),
            (self.num_workers >= 0, f"num_workers must be >= 0, got {self.num_workers}"),
            (
                self.heldout_episodes is None or 0 <= self.heldout_episodes < 1,
                f"heldout_episodes is a share in [0, 1) or None (chosen from the dataset), got {self.heldout_episodes}",
            ),
            (self.eval_every >= 1, f"eval_every must be >= 1, got {self.eval_every}"),
            (self.eval_chunks >= 1, f"eval_chunks must be >= 1, got {self.eval_chunks}"),
            (self.report_chunks >= 1, f"report_chunks must be >= 1, got {self.report_chunks}"),
            (
                self.mixed_precision in ("auto", "no", "bf16", "fp16"),
                f"mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def resolve_action_state(policy: VLAConfig, info: DatasetInfo) -> VLAConfig:
    """``policy`` with ``action_state_dims`` and ``relative_actions`` fixed from the dataset
    (``vla.data.defaults.action_state``): the state dimension of each action dimension (by name, else by values, else one
    to one when the dims agree; None when none matches), and ``"auto"`` turned into its mask (the dims whose state
    dimension tracks them, grippers kept absolute)."""
    from vla.data import defaults

    return defaults.action_state(policy, info)[0]


def load_config(config_path: str | None = None, args: list[str] | None = None, log=print) -> TrainConfig:
    """Parse a YAML file (a short diff against the defaults) plus ``--key=value`` overrides (``--config_path``
    among them). A bad value is one ``ValueError`` naming it and the fix, not draccus' traceback; an unknown flag is
    one line with the closest known one, not draccus' usage; ``--a-b`` is read as ``--a_b``. A config file is a path,
    or the name of a shipped one (``fast``, ``fast.yaml`` or ``configs/fast.yaml`` from any folder). The dataset is
    said when neither the command line nor the file names one (and refused when that default is absent and no file
    was given)."""
    args = check_options(list(args or []))
    flags = [i for i, a in enumerate(args) if a.split("=", 1)[0] == "--config_path"]
    named = [args[i].split("=", 1)[1] if "=" in args[i] else (args[i + 1] if i + 1 < len(args) else "") for i in flags]
    args = [a for i, a in enumerate(args) if i not in set(flags) | {i + 1 for i in flags if "=" not in args[i]}]
    paths = [find_config(p) for p in ([config_path] if config_path is not None else []) + named]
    path = paths[-1] if paths else None
    if not any(a.split("=", 1)[0] == "--dataset_root" for a in args):
        _say_dataset(path, log)
    with tempfile.TemporaryDirectory() as tmp:
        if path is None:  # no config file: every setting vla.data.defaults chooses starts unset
            from vla.data.defaults import FROM_DATA

            path = str(Path(tmp) / "from_data.yaml")
            Path(path).write_text(yaml.safe_dump(FROM_DATA, sort_keys=False))
        copy = _without_other_tokenizer_options(path, args, Path(tmp))
        return _parse(copy or path, _with_tokenizer_type(path, args))


def shipped_configs(here: Path | None = None) -> Path | None:
    """The experiment files that come with the package: the checkout's ``configs/``, or the copy an installed wheel
    carries (``vla/configs``, pyproject.toml's force-include); ``here`` is the ``vla`` package's folder."""
    here = here or Path(__file__).resolve().parent
    return next((d for d in (here.parent / "configs", here / "configs") if (d / "fast.yaml").is_file()), None)


def find_config(path: str, here: Path | None = None) -> str:
    """``path`` if it is a file, else the shipped config it names (``fast``, ``fast.yaml``, ``configs/fast.yaml``);
    otherwise a ``ValueError`` naming the closest shipped one and where they are."""
    if Path(path).is_file():
        return path
    shipped = shipped_configs(here)
    name = Path(path).name if Path(path).suffix in (".yaml", ".yml") else f"{Path(path).name}.yaml"
    inside = Path(path).parent.as_posix() in (".", "configs", "vla/configs")  # a name, not some other folder
    if shipped is not None and inside and (shipped / name).is_file():
        return str(shipped / name)
    if shipped is None:
        raise ValueError(
            f"no config file {path!r}, and no shipped configs beside the package; pass a path to a YAML "
            "file, or reinstall the package"
        )
    known = sorted(p.stem for p in shipped.glob("*.yaml"))
    close = suggestion(Path(name).stem, known)
    raise ValueError(
        f"no config file {path!r}{close} (the shipped configs, in {shipped}: {', '.join(known)}); pass "
        "one by name (--config_path fast) or a path to your own YAML file"
    )


def _say_dataset(config: str | None, log) -> None:
    """The dataset a run with no ``--dataset_root`` uses: the file's, or the default (said; refused when absent and
    no file was given, since training would otherwise start on a dataset the user never named)."""
    content = yaml.safe_load(Path(config).read_text()) if config is not None else None
    if isinstance(content, dict) and content.get("dataset_root"):
        return
    default = TrainConfig.dataset_root
    where = f"{config} names none" if config is not None else "no config file was given"
    if config is None and not Path(default).is_dir():
        raise ValueError(
            f"no --dataset_root given ({where}), and the default {default} (the demo's push-v3 recording)"
            " is not here; pass --dataset_root=DIR (a LeRobot v3.0 dataset), or record the default with "
            "vla data record --task push-v3 --episodes 100"
        )
    if log is not None:
        log(
            f"dataset_root = {default}: the default, no --dataset_root given ({where}); pass --dataset_root=DIR for "
            "your own"
        )


def known_options() -> list[str]:
    """Every ``--flag`` ``vla train`` reads: ``--config_path``, the run's fields, ``--policy.<VLAConfig field>``
    (``--policy.path`` for fine-tuning), ``--tokenizer.type`` and every tokenizer's options."""
    from vla.tokenizer_choice import TOKENIZER_CONFIGS

    top = [f"--{f.name}" for f in dataclasses.fields(TrainConfig) if f.name not in ("policy", "tokenizer")]
    policy = [f"--policy.{f.name}" for f in dataclasses.fields(VLAConfig)] + ["--policy.path"]
    tokenizer = {f"--tokenizer.{f.name}" for c in TOKENIZER_CONFIGS.values() for f in dataclasses.fields(c)}
    return ["--config_path", "-h", "--help", *top, *policy, "--tokenizer.type", *sorted(tokenizer)]


def check_options(args: list[str]) -> list[str]:
    """``args`` with ``--a-b`` written ``--a_b``; an unknown flag is a ``ValueError`` with the closest known one."""
    known, out = known_options(), []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and not _is_number(arg):
            head = ".".join(flag.replace("-", "_").lstrip("_").split(".")[:2])  # --policy.a.b: its field policy.a
            if flag not in known and f"--{head}" in known:
                flag = "--" + flag.lstrip("-").replace("-", "_")
            elif flag not in known:
                raise ValueError(
                    f"unknown option {flag}{suggestion(flag, known, cutoff=0.6)} (vla train --help lists every option)"
                )
        out.append(flag + eq + value)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _without_other_tokenizer_options(path: str | None, args: list[str], tmp: Path) -> str | None:
    """A copy in ``tmp`` of the YAML at ``path`` without its tokenizer options when ``--tokenizer.type`` on the command
    line chooses another tokenizer (``--tokenizer.type=beast`` on a file that sets FAST's ``scale`` starts BEAST from
    its defaults, where draccus would refuse ``scale`` as no field of BEAST's); None when the file can be used as is."""
    chosen = [a.split("=", 1)[1] for a in args if a.startswith("--tokenizer.type=")]
    if path is None or not chosen:
        return None
    content = yaml.safe_load(Path(path).read_text()) or {}
    tokenizer = content.get("tokenizer") if isinstance(content, dict) else None
    if not isinstance(tokenizer, dict) or tokenizer.get("type", DEFAULT_TOKENIZER) == chosen[-1]:
        return None
    content["tokenizer"] = {"type": chosen[-1]}
    copy = tmp / Path(path).name
    copy.write_text(yaml.safe_dump(content, sort_keys=False))
    return str(copy)


def _with_tokenizer_type(path: str, args: list[str]) -> list[str]:
    """``args`` with ``--tokenizer.type`` set when they set a tokenizer option but neither they nor the file at
    ``path`` name the type (``vla train --dataset_root=DIR --tokenizer.vocab_size=128``: draccus reads a tokenizer
    section only with its type): the type saved at ``--tokenizer.pretrained_path``, else the default tokenizer."""
    options = dict(a.split("=", 1) if "=" in a else (a, "") for a in args if a.startswith("--tokenizer."))
    if not options or "--tokenizer.type" in options:
        return args
    content = yaml.safe_load(Path(path).read_text()) or {}
    tokenizer = content.get("tokenizer") if isinstance(content, dict) else None
    if isinstance(tokenizer, dict) and "type" in tokenizer:
        return args
    saved = options.get("--tokenizer.pretrained_path")  # a saved tokenizer names its own type
    return [f"--tokenizer.type={at.saved_type(saved) if saved else DEFAULT_TOKENIZER}", *args]


def _parse(config_path: str | None, args: list[str]) -> TrainConfig:
    try:
        return draccus.parse(TrainConfig, config_path=config_path, args=args)
    except draccus.utils.ParsingError as err:
        cause: BaseException = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        raise ValueError(f"{cause}" if isinstance(cause, ValueError) else f"the config does not parse: {err}") from None
