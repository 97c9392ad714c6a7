"""Files, written so that nothing is half-written, and read so that nothing is misread: every module that saves
(policies, checkpoints, recordings, reports) goes through here.

    with atomic_directory("outputs/x/policy") as tmp:   # a hidden sibling, renamed into place on success
        write_json(tmp / "config.json", {...})
    atomic_write_text(path, text)                       # one file through a temporary name
    config = read_json(path, "checkpoint", format_version=1)   # a clear error for missing/corrupt/other version

The primitives live in the tokenizer library (``action_tokenizers.io``), which must save its own artefacts
without depending on ``vla``; this module is the one place ``vla`` takes them from.
"""

from __future__ import annotations

from action_tokenizers.io import atomic_directory, atomic_write_text, read_json, write_json

__all__ = ["atomic_directory", "atomic_write_text", "read_json", "write_json"]
