"""The published FAST processor: its BPE trainer settings, its saved-file layout (read and written), and a
readable, per-chunk transcription of its algorithm (not its code).

The transcription (``fit`` / ``encode`` / ``decode``) exists to prove equivalence and to benchmark against:
``FASTTokenizer(byte_level=True)`` must give the same ids, and the vectorised tokenizer must beat this loop. It keeps
the reference's behaviour exactly, including its weaknesses (values above the fitted range are not clipped;
undecodable ids become an all-zero chunk). Not for production use.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import scipy.fft

from tokenizers import ByteLevelBPETokenizer, Tokenizer, trainers

from .base import check_saved
from .io import read_json


def bpe_trainer(vocab_size: int, n_symbols: int, show_progress: bool) -> trainers.BpeTrainer:
    """The reference trainer settings: every symbol in the initial alphabet, merges seen at least twice."""
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=show_progress,
        special_tokens=[],
        initial_alphabet=[chr(i) for i in range(n_symbols)],
        max_token_length=10000,
    )


def load_bpe(path: Path) -> Tokenizer:
    if not path.is_file():
        raise ValueError(f"BPE file {path} is missing; save the tokenizer again")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for malformed files
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"BPE file {path} is corrupt ({reason}); save the tokenizer again") from None


def read_reference(directory: Path) -> tuple[Tokenizer, dict, int]:
    """A local copy of the reference processor's files -> (byte-level BPE, processor config, alphabet size).

    Needs ``processor_config.json`` and ``tokenizer.json``, the latter beside it or in ``bpe_tokenizer/`` (the
    layout transformers 5 writes); nothing is executed. The reference does not store the alphabet size; it is read
    off the vocabulary (its single-character tokens) and only used to build the decoding constraint.
    """
    path = directory / "processor_config.json"
    config = check_saved(
        read_json(path, "reference FAST processor"),
        path,
        {
            "scale": "number>0",
            "min_token": "int",
            "vocab_size": "int>=1?",
            "time_horizon": "int>=1?",
            "action_dim": "int>=1?",
        },
    )
    candidates = [directory / "tokenizer.json", directory / "bpe_tokenizer" / "tokenizer.json"]
    bpe_path = next((p for p in candidates if p.is_file()), None)
    if bpe_path is None:
        raise ValueError(f"no tokenizer.json in {directory} or {directory / 'bpe_tokenizer'}; copy the BPE files too")
    bpe = load_bpe(bpe_path)
    # The initial alphabet is chr(0) .. chr(n - 1); the byte stand-ins of the trained strings are single-character
    # tokens too, and share code points with part of it, so n is the first code point missing from the single
    # characters: exact where the next code point is no stand-in the data produced, else a little above (a looser
    # decoding constraint, never one that forbids an id sequence the encoder writes).
    singles = {tok for tok in bpe.get_vocab() if len(tok) == 1}
    n_symbols = next(c for c in itertools.count() if chr(c) not in singles)
    if n_symbols == 0:  # no alphabet of its own: the widest the vocabulary allows
        n_symbols = int(config.get("vocab_size") or bpe.get_vocab_size()) + 1
    return bpe, config, n_symbols


def fit(chunks: list[np.ndarray], scale: float = 10.0, vocab_size: int = 1024) -> tuple[Tokenizer, int]:
    """Returns (byte-level BPE, min_token), trained the way the reference trains it."""
    coefs = [scipy.fft.dct(np.asarray(c, float), axis=0, norm="ortho").flatten() for c in chunks]
    rounded = np.around(np.concatenate(coefs) * scale)
    min_token, max_token = int(rounded.min()), int(rounded.max())
    assert max_token - min_token <= vocab_size, "vocab_size too small for the coefficient range"
    strings = ("".join(map(chr, (np.around(c * scale) - min_token).astype(int))) for c in coefs)
    bpe = ByteLevelBPETokenizer()._tokenizer
    bpe.train_from_iterator(strings, trainer=bpe_trainer(vocab_size, max_token - min_token + 1, False))
    return bpe, min_token


def encode(bpe: Tokenizer, chunks: np.ndarray, scale: float, min_token: int) -> list[list[int]]:
    ids = []
    for chunk in np.asarray(chunks, float):  # one chunk at a time, like the reference
        coef = np.around(scipy.fft.dct(chunk, axis=0, norm="ortho") * scale)
        text = "".join(map(chr, np.maximum(coef.flatten() - min_token, 0).astype(int)))
        ids.append(bpe.encode(text).ids)
    return ids


def decode(bpe: Tokenizer, ids: list[list[int]], scale: float, min_token: int, time_horizon: int, action_dim: int):
    out = []
    for row in ids:
        try:
            coef = np.array(list(map(ord, bpe.decode(row)))) + min_token
            coef = coef.reshape(-1, action_dim)
            assert coef.shape == (time_horizon, action_dim)
        except Exception:  # the reference prints and substitutes zeros
            coef = np.zeros((time_horizon, action_dim))
        out.append(scipy.fft.idct(coef / scale, axis=0, norm="ortho"))
    return np.stack(out)


def save_layout(directory: Path, bpe: Tokenizer, scale: float, vocab_size: int, min_token: int, subfolder: bool):
    """Write the reference's saved-file layout: processor_config.json + tokenizer files (root or bpe_tokenizer/)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "action_dim": None,
        "auto_map": {"AutoProcessor": "processing_action_tokenizer.UniversalActionProcessor"},
        "min_token": min_token,
        "processor_class": "UniversalActionProcessor",
        "scale": scale,
        "time_horizon": None,
        "vocab_size": vocab_size,
    }
    (directory / "processor_config.json").write_text(json.dumps(config, indent=2))
    bpe_dir = directory / "bpe_tokenizer" if subfolder else directory
    bpe_dir.mkdir(exist_ok=True)
    bpe.save(str(bpe_dir / "tokenizer.json"))
    (bpe_dir / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False})
    )
