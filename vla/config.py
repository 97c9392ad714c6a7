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

import tempfile
from pathlib import Path
from dataclasses import dataclass, field

import draccus
import yaml

from vla.data.reader import DatasetInfo
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
            (self.heldout_episodes is None or 0 <= self.heldout_episodes < 1,
             f"heldout_episodes is a share in [0, 1) or None (chosen from the dataset), got {self.heldout_episodes}"),
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


def load_config(config_path: str | None = None, args: list[str] | None = None) -> TrainConfig:
    """Parse a YAML file (a short diff against the defaults) plus ``--key=value`` overrides (``--config_path``
    among them is read by draccus). A bad value is one ``ValueError`` naming it and the fix, not draccus' traceback."""
    args = list(args or [])
    named = [a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
             for i, a in enumerate(args) if a.split("=", 1)[0] == "--config_path"]  # fmt: skip
    for path in ([config_path] if config_path is not None else []) + named:
        if not Path(path).is_file():
            raise ValueError(f"no config file {path!r}; pass one of configs/*.yaml or your own YAML file")
    path = named[-1] if named else config_path
    with tempfile.TemporaryDirectory() as tmp:
        if path is None:  # no config file: every setting vla.data.defaults chooses starts unset
            from vla.data.defaults import FROM_DATA

            config_path = path = str(Path(tmp) / "from_data.yaml")
            Path(path).write_text(yaml.safe_dump(FROM_DATA, sort_keys=False))
        copy = _without_other_tokenizer_options(path, args, Path(tmp))
        if copy is None:
            return _parse(config_path, args)
        flags = [i for i, a in enumerate(args) if a.split("=", 1)[0] == "--config_path"]
        dropped = set(flags) | {i + 1 for i in flags if "=" not in args[i]}
        return _parse(copy, [a for i, a in enumerate(args) if i not in dropped])


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


def _parse(config_path: str | None, args: list[str]) -> TrainConfig:
    try:
        return draccus.parse(TrainConfig, config_path=config_path, args=args)
    except draccus.utils.ParsingError as err:
        cause: BaseException = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        raise ValueError(f"{cause}" if isinstance(cause, ValueError) else f"the config does not parse: {err}") from None
