"""Files, written so that nothing is half-written, and read so that nothing is misread: every module that saves
(policies, checkpoints, recordings, reports) goes through here.

    with atomic_directory("outputs/x/policy") as tmp:   # a hidden sibling, renamed into place on success
        write_json(tmp / "config.json", {...})
    atomic_write_text(path, text)                       # one file through a temporary name (atomic_file: any)
    save_figure(fig, path)                              # a plot the same way, and the figure closed
    config = read_json(path, "checkpoint", format_version=1)   # a clear error for missing/corrupt/other version

The primitives live in the tokenizer library (``action_tokenizers.io``), which must save its own artefacts
without depending on ``vla``; this module is the one place ``vla`` takes them from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from action_tokenizers.io import atomic_directory, atomic_file, atomic_write_text, read_json, write_json

__all__ = ["atomic_directory", "atomic_file", "atomic_write_text", "read_json", "save_figure", "write_json"]


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 120) -> None:
    """Save a matplotlib figure to ``path`` (its format from the suffix) through a temporary name in the same
    directory, then rename it into place, and close the figure."""
    import matplotlib.pyplot as plt

    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi)
    finally:
        plt.close(fig)
