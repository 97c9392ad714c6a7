"""Names -> tokenizer classes, and ``load_tokenizer`` for anything ``save_pretrained`` (or the reference) wrote."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .base import CONFIG_NAME, FORMAT_VERSION, ActionTokenizer, read_json
from .binning import BinningTokenizer
from .fast import FASTTokenizer
from .fsq import FSQTokenizer

TOKENIZERS: dict[str, type[ActionTokenizer]] = {
    FASTTokenizer.name: FASTTokenizer,
    BinningTokenizer.name: BinningTokenizer,
    FSQTokenizer.name: FSQTokenizer,
}


def get_tokenizer_class(name: str) -> type[ActionTokenizer]:
    """The class registered under ``name``; an unknown name gets the closest known one suggested."""
    if name not in TOKENIZERS:
        close = difflib.get_close_matches(str(name), TOKENIZERS, n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown tokenizer {name!r}{hint} (known: {', '.join(TOKENIZERS)})")
    return TOKENIZERS[name]


def load_tokenizer(directory: str | os.PathLike) -> ActionTokenizer:
    """Load a tokenizer saved by ``save_pretrained``, or a local copy of the reference FAST processor files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"no tokenizer directory at {directory}; pass the folder save_pretrained wrote")
    if not (directory / CONFIG_NAME).exists() and (directory / "processor_config.json").exists():
        return FASTTokenizer.from_reference(directory)
    config = read_json(directory / CONFIG_NAME, "action tokenizer")
    version = config.pop("format_version", None)
    if version != FORMAT_VERSION:
        raise ValueError(f"{directory / CONFIG_NAME} has format_version {version!r}; this library reads {FORMAT_VERSION}")
    cls = get_tokenizer_class(config.pop("type", None))
    try:
        return cls._from_saved(config, directory)
    except KeyError as err:
        raise ValueError(f"{directory / CONFIG_NAME} lacks the field {err}; save the tokenizer again") from None
