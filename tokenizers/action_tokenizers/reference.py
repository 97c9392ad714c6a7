"""A readable, per-chunk transcription of the published FAST processor's algorithm (not its code).

It exists to prove equivalence and to benchmark against: ``FASTTokenizer(byte_level=True)`` must give the same
ids, and the vectorised tokenizer must beat this loop. It keeps the reference's behaviour exactly, including its
weaknesses (values above the fitted range are not clipped; undecodable ids become an all-zero chunk). Not for
production use.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.fft
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from .fast import bpe_trainer


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
