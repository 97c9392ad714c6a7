"""Names -> tokenizer classes, and ``load_tokenizer`` for anything ``save_pretrained`` (or the reference) wrote.

Each class declares its fit options as a dataclass, ``cls.Options``: ``cls.fit(chunks, **asdict(cls.Options()))``
is ``cls.fit(chunks)``, and every field carries a one-line ``help`` in its metadata (config generators read it).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from .base import CONFIG_NAME, FORMAT_VERSION, ActionTokenizer
from .beast import BEASTTokenizer
from .binning import BinningTokenizer
from .fast import FASTTokenizer
from .fsq import FSQTokenizer
from .io import read_json

TOKENIZERS: dict[str, type[ActionTokenizer]] = {
    FASTTokenizer.name: FASTTokenizer,
    BinningTokenizer.name: BinningTokenizer,
    FSQTokenizer.name: FSQTokenizer,
    BEASTTokenizer.name: BEASTTokenizer,
}


def get_tokenizer_class(name: str) -> type[ActionTokenizer]:
    """The class registered under ``name``; an unknown name gets the closest known one suggested."""
    if name not in TOKENIZERS:
        close = difflib.get_close_matches(str(name), TOKENIZERS, n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown tokenizer {name!r}{hint} (known: {', '.join(TOKENIZERS)})")
    return TOKENIZERS[name]


def load_tokenizer(directory: str | os.PathLike) -> ActionTokenizer:
    """Load a tokenizer saved by ``save_pretrained``, or a local copy of the reference FAST processor files.

    Every field of the saved config is validated; any problem is one ``ValueError`` naming the file and the fix.
    """
    saved = _saved_config(directory)
    if saved is None:
        return FASTTokenizer.from_reference(Path(directory))
    path, config = saved
    cls = get_tokenizer_class(config.pop("type"))
    choices = _fit_choices(config.pop("fit_choices", {}), path)
    tok = cls._from_saved(config, Path(directory))
    tok.fit_choices = choices
    return tok


def saved_type(directory: str | os.PathLike) -> str:
    """The name of the tokenizer saved in ``directory`` (``"fast"`` for the reference FAST processor files), read
    without loading it: what a config must name to load it."""
    saved = _saved_config(directory)
    return FASTTokenizer.name if saved is None else saved[1]["type"]


def _saved_config(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """``(path, config)`` of the tokenizer saved in ``directory``, its type checked and its format version dropped;
    None for a local copy of the reference FAST processor files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"no tokenizer directory at {directory}; pass the folder save_pretrained wrote")
    path = directory / CONFIG_NAME
    if not path.exists() and (directory / "processor_config.json").exists():
        return None
    config = read_json(path, "action tokenizer", format_version=FORMAT_VERSION)
    config.pop("format_version")
    try:
        get_tokenizer_class(config.get("type"))
    except ValueError as err:
        raise ValueError(f"{path}: {err}; save the tokenizer again") from None
    return path, config


MAX_FIT_CHOICES = 16  # a saved tokenizer's record of what its fit chose: a few named settings, no more


def _fit_choices(saved: Any, path: Path) -> dict[str, tuple[Any, str]]:
    """A saved ``fit_choices`` record (name -> {value, why}) read back, or one ``ValueError`` naming the file."""
    ok = isinstance(saved, dict) and len(saved) <= MAX_FIT_CHOICES
    ok = ok and all(
        isinstance(k, str) and isinstance(v, dict) and set(v) == {"value", "why"} and isinstance(v["why"], str)
        for k, v in saved.items()
    )
    if not ok:
        raise ValueError(
            f"{path}: fit_choices must map at most {MAX_FIT_CHOICES} setting names to {{value, why}}; remove it "
            "or save the tokenizer again"
        )
    return {k: (v["value"], v["why"]) for k, v in saved.items()}
