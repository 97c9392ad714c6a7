"""``vla train``'s command line: draccus' config plus LeRobot's ``--policy.path`` for fine-tuning (``parse_args``),
the run (``vla.train.main``), and the one line a stopped run leaves (Ctrl-C, a full disk) instead of a traceback."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import action_tokenizers as at

from vla.checkpoints import latest_checkpoint, no_space
from vla.config import TrainConfig, load_config
from vla.io import read_json
from vla.policy.modeling_vla import TOKENIZER_DIR
from vla.policy.saved_config import check_policy_folder, load_policy_config
from vla.tokenizer_choice import tokenizer_config
from vla.train import Interrupted, main
from vla.train import __doc__ as TRAIN_DOC


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy (draccus config: --config_path FILE plus --key=value overrides)",
        description=TRAIN_DOC,
        add_help=False,
    )
    p.set_defaults(func=_run, accepts_extra=True)


def _run(args) -> int:
    from accelerate import PartialState

    cfg = parse_args(list(getattr(args, "extra", [])))  # draccus reads --config_path itself
    try:
        main(cfg)  # its last lines: the final loss, the offline verdict and the next step
    except KeyboardInterrupt as err:  # Ctrl-C: where the run stands and how to go on, not a traceback
        if PartialState().is_main_process:
            print(f"vla train: {stopped(cfg, _step_of(err))}", file=sys.stderr)
        return 130
    except Exception as err:  # any write that met a full disk (metrics, the final policy): the folder and the fix
        full = no_space(err, Path(cfg.output_dir), "the run's files")
        if full is None:
            raise
        raise full from None
    return 0


def parse_args(argv: list[str]) -> TrainConfig:
    """``load_config``, and LeRobot's ``--policy.path=DIR`` (or ``--policy.pretrained_path``) for fine-tuning: the
    saved policy's ``config.json`` becomes the policy's config, with the command line's ``--policy.*`` options on top
    (the YAML's ``policy:`` section is not used), and its tokenizer is the run's (``--tokenizer.*`` is refused)."""
    options = _options(argv)
    paths = [value for flag, value in options if flag in ("--policy.path", "--policy.pretrained_path")]
    if not paths:
        return load_config(args=argv)
    path = Path(paths[-1])
    given = [f for f, _ in options if f.startswith("--tokenizer.")]
    if given:
        raise ValueError(
            f"{given[0]} does not apply with --policy.path: fine-tuning keeps the policy's own tokenizer "
            f"({path / TOKENIZER_DIR}); drop the --tokenizer options, or train a new policy without "
            "--policy.path"
        )
    check_policy_folder(path, "--policy.path")
    policy_options = [
        (f, v)
        for f, v in options
        if f.startswith("--policy.") and f not in ("--policy.path", "--policy.pretrained_path")
    ]
    rest = [f"{f}={v}" if v is not None else f for f, v in options if not f.startswith("--policy.")]
    cfg = load_config(args=rest)
    overrides = [f"--{f.removeprefix('--policy.')}={v}" for f, v in policy_options]
    if not any(f == "--policy.device" for f, _ in policy_options):
        overrides.insert(0, "--device=null")  # chosen here (a GPU when there is one), not the machine it was saved on
    policy = load_policy_config(path, [*overrides, f"--pretrained_path={path}"])
    kind = at.saved_type(path / TOKENIZER_DIR)
    return dataclasses.replace(
        cfg, policy=policy, tokenizer=tokenizer_config(kind, pretrained_path=str(path / TOKENIZER_DIR))
    )


def _options(argv: list[str]) -> list[tuple[str, str | None]]:
    """``--flag=value`` and ``--flag value`` as (flag, value) pairs (value None for a bare flag)."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if "=" in arg:
            flag, value = arg.split("=", 1)
            out.append((flag, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((arg, argv[i + 1]))
            i += 1
        else:
            out.append((arg, None))
        i += 1
    return out


def stopped(cfg: TrainConfig, step: int | None) -> str:
    """What a Ctrl-C at ``step`` leaves: the checkpoint a resume continues from, or that none was written."""
    run = Path(cfg.output_dir)
    try:
        last = latest_checkpoint(run)
    except ValueError:
        last = None
    at = f"stopped at step {step} (Ctrl-C)" if step else "stopped (Ctrl-C) before the first step"
    if last is None:
        before = f", before the first checkpoint (every {cfg.save_every} steps)," if step else ";"
        return f"{at}{before} so no checkpoint was written; the same command starts the run again in {run}"
    saved = read_json(last / "trainer_state.json", "checkpoint")["step"]
    redone = (
        "nothing is redone"
        if step is None or step <= saved
        else f"step {step} is redone"
        if step == saved + 1
        else f"steps {saved + 1}-{step} are redone"
    )
    return f"{at}; the last checkpoint is step {saved} ({last}): resume with --resume=true ({redone})"


def _step_of(err: BaseException) -> int | None:
    """The last step the training loop finished when Ctrl-C stopped it (None when it stopped before the loop)."""
    return err.step if isinstance(err, Interrupted) else None
