"""The ``vla`` command: one sub-command per job, each a thin call into a module.

Every module listed in ``COMMANDS`` exposes ``add_cli(subparsers)``, which adds its own sub-parser and sets
``func`` (called with the parsed namespace). Modules are imported only when their command runs, so
``vla --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys

from vla.names import suggestion

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("vla.data.cli", "record demonstrations into a LeRobot dataset; describe one"),
    "compare": ("vla.compare", "compare action tokenizers on a dataset"),
    "tokenizer": ("vla.fit", "fit an action tokenizer on a dataset (vla tokenizer fit)"),
    "train": ("vla.train_cli", "train a policy from a config"),
    "eval": ("vla.evaluate", "closed-loop evaluation of a trained policy"),
    "inspect": ("vla.inspect", "draw one sample's token layout, attention mask and decoding steps"),
    "serve": ("vla.serve.cli", "serve a policy to robots over websockets (openpi's protocol)"),
    "study": ("vla.study.cli", "closed-loop studies: tokenizers x settings x training seeds, with intervals"),
    "demo": ("vla.demo", "record, fit, train and evaluate every tokenizer, then compare"),
}
TRAINING = ("train", "demo", "study")  # the commands that train, for which a CPU-only machine is worth a warning


class CpuWarnings(logging.Filter):
    """Drops LeRobot's warnings that a policy config built on a machine without a GPU falls back to the CPU ("No
    accelerated backend detected ... this will be slow", "Device 'None' is not available. Switching to 'cpu'"):
    ``vla data info`` or ``vla compare`` build a config to say what training would choose, and run nothing slow."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("No accelerated backend detected" in text or "is not available. Switching to 'cpu'" in text)


@contextlib.contextmanager
def quiet_cpu_warnings(command: str | None):
    """``CpuWarnings`` on the loggers LeRobot warns through, for the block, unless ``command`` trains."""
    loggers = [logging.getLogger(), logging.getLogger("lerobot.configs.policies")]
    quiet = command not in TRAINING
    if quiet:
        for logger in loggers:
            logger.addFilter(_FILTER)
    try:
        yield
    finally:
        if quiet:
            for logger in loggers:
                logger.removeFilter(_FILTER)


_FILTER = CpuWarnings()


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error, not only its message")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).add_cli(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def command_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The ``--options`` of the (sub-)command ``argv`` names: ``vla data record ...`` -> ``vla data record``'s."""
    words = [a for a in argv if not a.startswith("-")]
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = next((subs[0].choices[w] for w in words[:1] if subs and w in subs[0].choices), None)
        if chosen is None:
            return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        parser, words = chosen, words[1:]


def one_spelling(argv: list[str], options: list[str]) -> list[str]:
    """``argv`` with each ``--a_b`` written as the command spells it, ``--a-b`` (or the other way round): one
    spelling works for every command (``vla train --dataset_root`` and ``vla compare --time_horizon`` alike)."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if arg.startswith("--") and flag not in options:
            flag = next((o for o in options if o.replace("_", "-") == flag.replace("_", "-")), flag)
        out.append(flag + eq + value)
    return out


def unknown_options(extra: list[str], options: list[str]) -> str:
    """One line for arguments no option takes: each ``--flag`` with the closest known one."""
    flags = [a.partition("=")[0] for a in extra if a.startswith("-")]
    if not flags:
        return f"unexpected arguments: {' '.join(extra)}"
    return "; ".join(f"unknown option {f}{suggestion(f, options, cutoff=0.6)}" for f in flags)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    options = command_options(parser, argv)
    argv = one_spelling(argv, options)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):  # one line that names the fix, not the usage
        print(
            f"vla {args.command}: error: {unknown_options(extra, options)} (vla {args.command} --help lists every "
            "option)",
            file=sys.stderr,
        )
        return 2
    if extra:
        args.extra = extra
    try:
        with quiet_cpu_warnings(args.command):
            return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as err:  # user errors: one line that names the fix
        if args.debug:
            raise
        print(f"vla {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
