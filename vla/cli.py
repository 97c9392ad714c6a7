"""The ``vla`` command: one sub-command per job, each a thin call into a module.

Every module listed in ``COMMANDS`` exposes ``add_cli(subparsers)``, which adds its own sub-parser and sets
``func`` (called with the parsed namespace). Modules are imported only when their command runs, so
``vla --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognised arguments: {' '.join(extra)}")
    if extra:
        args.extra = extra
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as err:  # user errors: one line that names the fix
        if args.debug:
            raise
        print(f"vla {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
