"""What produced a result: every results file the project writes carries one ``provenance`` block.

    record = {"success_rate": 0.9, ..., "provenance": provenance(config=cfg_dict, dataset=root)}

The block names the code (git commit, and whether the working tree had uncommitted changes), the data (a
fingerprint of the dataset folder's files), the settings (the full config as a plain dict), the command line,
the numerics (torch threads, package versions, device) and when it was made. ``check(record)`` says what a
block lacks; ``tests/test_provenance.py`` refuses committed results files without one.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = 1
REQUIRED = ("format", "commit", "dirty", "command", "packages", "threads", "created")
PACKAGES = ("torch", "numpy", "transformers", "tokenizers", "lerobot", "mujoco", "metaworld", "scipy")
_BIG_FILE = 64 << 20  # files above this are fingerprinted by size, head and tail
# A speed figure is a headline only from a quiet machine: its 1-minute load average never above the benchmark's own
# threads plus this. A loaded machine slows a pure-Python loop more than vectorised code, so it inflates ratios.
QUIET_EXTRA_LOAD = 0.5


def quiet_machine(loads: list[float], threads: int) -> dict[str, Any]:
    """Whether the 1-minute load averages ``loads`` seen during a benchmark of ``threads`` threads leave its figures
    a headline (``quiet``), with the numbers that say so."""
    limit = threads + QUIET_EXTRA_LOAD
    return {"quiet": bool(loads) and max(loads) <= limit, "max_load": max(loads, default=None), "limit": limit}


def headline_path(path: Path, machine: dict[str, Any], allow_loaded: bool, log=print) -> Path:
    """Where a benchmark writes its figures: ``path`` when ``machine`` (``quiet_machine``) was quiet or the caller
    allows a loaded one, else ``<stem>.loaded<suffix>`` beside it, so that a loaded run never replaces a headline."""
    if machine["quiet"] or allow_loaded:
        return path
    loaded = path.with_name(f"{path.stem}.loaded{path.suffix}")
    log(
        f"WARNING: the machine was loaded (1-minute load up to {machine['max_load']:.2f}, above {machine['limit']:.1f} "
        f"for this benchmark): its figures go to {loaded}, not {path}; run again on a quiet machine, or pass "
        "--allow-loaded to record them as the headline anyway"
    )
    return loaded


def git_state(path: str | Path | None = None) -> tuple[str, bool]:
    """The commit the code at ``path`` (default: this package) was run from, and whether it had uncommitted
    changes to tracked files that run: measured results (``results/``) and Markdown pages do not count, so a
    benchmark that rewrites its own results file, or two that share one, still traces to a clean commit.
    ``("unknown", False)`` outside a git checkout (an installed wheel)."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return "unknown", False
        status = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)results",
                ":(top,exclude,glob)**/*.md",
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return commit.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def _canonical_json(path: Path) -> bytes | None:
    """A JSON file as sorted-key compact bytes (LeRobot writes ``meta/stats.json``'s features in an order that
    changes from run to run), or ``None`` when it does not parse."""
    try:
        return json.dumps(json.loads(path.read_text()), sort_keys=True, separators=(",", ":")).encode()
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def dataset_fingerprint(root: str | Path) -> dict[str, Any]:
    """A sha256 over every file of a dataset folder (relative path, size and content; JSON files by their
    sorted-key form, so that the same values in another key order count as the same; files above 64 MiB by size,
    first and last MiB), with the file count: two folders with the same fingerprint hold the same data."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {root} does not exist: give the folder that holds meta/ and data/")
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    for p in files:
        canonical = _canonical_json(p) if p.suffix == ".json" else None
        size = len(canonical) if canonical is not None else p.stat().st_size
        digest.update(f"{p.relative_to(root).as_posix()}\0{size}\0".encode())
        if canonical is not None:
            digest.update(canonical)
            continue
        with p.open("rb") as f:
            if size <= _BIG_FILE:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            else:
                digest.update(f.read(1 << 20))
                f.seek(-(1 << 20), os.SEEK_END)
                digest.update(f.read())
    return {"sha256": digest.hexdigest(), "files": len(files), "name": root.name, "json": "sorted keys"}


def portable_command(argv: list[str], cwd: str | Path | None = None) -> list[str]:
    """The command line with every absolute path written relative to the working folder (``/home/me/vla/vla/cli.py``
    -> ``vla/cli.py``, a sibling checkout -> ``../old``): what produced a file, without one machine's folders. A
    program of the running environment (``.venv/bin/vla``, wherever the environment lives) is written by its name."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    argv = list(map(str, argv))
    scripts = Path(sys.prefix, "bin").resolve()
    if argv and os.sep in argv[0] and Path(base, argv[0]).parent.resolve() == scripts:  # ../env/bin/vla too
        argv[0] = Path(argv[0]).name
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        if os.path.isabs(value):
            value = os.path.relpath(value, base)
        out.append(f"{key}{eq}{value}")
    return out


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that change numerics (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def processor_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else ``platform.processor()``, often empty on Linux): speed figures
    from two machines are comparable only when it matches."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(
    *,
    config: dict[str, Any] | None = None,
    dataset: str | Path | None = None,
    fingerprint: dict[str, Any] | None = None,
    command: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The provenance block of a results file (see the module docstring). ``fingerprint`` reuses one already
    computed for ``dataset``; ``extra`` adds fields (a wall time, a seed) as they are."""
    import torch  # here, so that reading a block needs no torch

    commit, dirty = git_state()
    block: dict[str, Any] = {
        "format": FORMAT,
        "commit": commit,
        "dirty": dirty,
        "command": portable_command(sys.argv if command is None else command),
        "config": config,
        "packages": package_versions(),
        "threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpus": os.cpu_count(),
        "processor": processor_name(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if dataset is not None or fingerprint is not None:
        block["dataset"] = fingerprint if fingerprint is not None else dataset_fingerprint(dataset)
    block.update(extra)
    return block


def check(record: Any) -> list[str]:
    """What a results record's provenance block lacks: an empty list when it is complete."""
    if not isinstance(record, dict) or not isinstance(record.get("provenance"), dict):
        return ["no 'provenance' block"]
    block = record["provenance"]
    return [f"provenance lacks '{key}'" for key in REQUIRED if key not in block]
