r"""Byte-level BPE encoding of a whole batch: the ByteLevel pre-tokenizer's split done in numpy, then the merges applied
to all words at once (``merges.py``; or, for a vocabulary it does not reproduce, each distinct word through the BPE
model once). The ids are exactly those of ``Tokenizer.encode_batch_fast``.

Hugging Face's ``ByteLevel`` pre-tokenizer (``use_regex=True``, no prefix space) cuts a string with GPT-2's pattern
``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``, maps each piece's UTF-8 bytes to
printable stand-in characters, and the BPE model merges within each piece (a "word") alone. On FAST's coefficient
strings most of the time goes to that regex, to the per-word merging and to building an ``Encoding`` per row; here the
cut and the merges are a few array operations over the batch.

With ``c`` the class of each character (letter, number, whitespace, other), a word starts at position ``i > 0`` when
* ``c[i]`` is whitespace: ``c[i-1]`` is not, or ``c[i+1]`` is not (``\s+(?!\S)`` leaves a run's last character
  for what follows);
* ``c[i]`` is not whitespace: ``c[i-1]`` is whitespace other than a space (`` ?`` takes only a plain space), or
  ``c[i-1]`` is of another class;
* and a contraction (``'`` starting a word, then ``s``, ``t``, ``re``, ``ve``, ``m``, ``ll`` or ``d``) is one word
  that always ends after its letters.
The classes are read off the tokenizer's own pre-tokenizer for code points below ``LIMIT``; a row holding a larger
code point goes through ``encode_batch_fast`` instead. ``tests/action_tokenizers/test_byte_level.py`` checks the
cut against the pre-tokenizer on random strings of the characters where the rules differ.
"""

from __future__ import annotations

import json
from itertools import chain

import numpy as np

from tokenizers import Tokenizer

from .coefficients import ints_to_strings, split_rows, string_to_ints
from .merges import Merges
from .utf8 import REPLACEMENT, UNICODE_TO_BYTE, ByteDecoder

LIMIT = 0x800  # code points probed: those of one or two UTF-8 bytes (FAST's alphabets are far smaller)
LETTER, NUMBER, OTHER, SPACE = 0, 1, 2, 3
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # after an apostrophe, in the pattern's order
APOSTROPHE, BLANK = ord("'"), ord(" ")
PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def supported(bpe: Tokenizer) -> bool:
    """Whether ``bpe`` is the byte-level BPE this module reproduces (no normalizer, the ByteLevel split)."""
    config = json.loads(bpe.to_str())
    pre = config.get("pre_tokenizer") or {}
    return (
        config.get("normalizer") is None
        and all(pre.get(k) == v for k, v in PRE_TOKENIZER.items() if k != "trim_offsets")
        and (config.get("model") or {}).get("type") == "BPE"
        and not config.get("added_tokens")
    )


class ByteLevelEncoder:
    """``encode(symbols [B, L] code points) -> ids per row``, equal to ``bpe.encode_batch_fast`` on the strings."""

    def __init__(self, bpe: Tokenizer):
        self.bpe = bpe
        pre = bpe.pre_tokenizer

        def joins(left: str, c: str) -> bool:  # c continues a word that starts with ``left``
            return len(pre.pre_tokenize_str(left + c)) == 1

        classes = []
        for cp in range(LIMIT):
            c = chr(cp)
            classes.append(LETTER if joins("a", c) else NUMBER if joins("1", c) else OTHER if joins("!", c) else SPACE)
        self.classes = np.array(classes, dtype=np.int8)
        byte_to_char = {b: c for c, b in UNICODE_TO_BYTE.items()}
        stand_ins = ["".join(byte_to_char[b] for b in chr(cp).encode("utf-8")) for cp in range(LIMIT)]
        self.lengths = np.array([len(s) for s in stand_ins], dtype=np.int64)  # UTF-8 bytes per code point
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.flat = np.array([ord(c) for s in stand_ins for c in s], dtype=np.int64)
        # For ``merges``: the ids each code point starts as (its bytes' stand-ins, less those not in the vocabulary,
        # which the model drops), each followed by the gap that ends a word, laid out like ``flat``.
        self.merges = Merges.from_bpe(bpe)
        vocab, gap = bpe.get_vocab(), bpe.get_vocab_size()
        start_ids = [[vocab[c] for c in s if c in vocab] for s in stand_ins]
        self.id_lengths = np.array([len(i) for i in start_ids], dtype=np.int64)
        self.id_offsets = np.concatenate([[0], np.cumsum(self.id_lengths + 1)[:-1]])
        self.id_flat = np.array([i for ids in start_ids for i in [*ids, gap]], dtype=np.int64)

    def word_starts(self, symbols: np.ndarray) -> np.ndarray:
        """``[B, L]`` code points (all below ``LIMIT``) -> ``[B, L]`` bool, True where a word starts."""
        b, n = symbols.shape
        c = self.classes[symbols]
        space = c == SPACE
        starts = np.ones((b, n), dtype=bool)
        if n > 1:
            run_ends = np.zeros((b, n - 1), dtype=bool)  # the next character is not whitespace
            run_ends[:, :-1] = ~space[:, 2:]
            starts[:, 1:] = np.where(
                space[:, 1:],
                ~space[:, :-1] | run_ends,
                np.where(space[:, :-1], symbols[:, :-1] != BLANK, c[:, :-1] != c[:, 1:]),
            )
        rows, cols = np.nonzero((symbols == APOSTROPHE) & starts)
        if len(rows):
            padded = np.concatenate([symbols, np.zeros((b, 2), dtype=symbols.dtype)], axis=1)
            done = np.zeros(len(rows), dtype=bool)
            for letters in CONTRACTIONS:
                match = ~done
                for j, letter in enumerate(letters):
                    match &= padded[rows, np.minimum(cols + 1 + j, n + 1)] == ord(letter)
                match &= cols + len(letters) < n
                done |= match
                r, i = rows[match], cols[match]
                for j in range(1, len(letters) + 1):
                    starts[r, i + j] = False
                after = i + len(letters) + 1 < n
                starts[r[after], i[after] + len(letters) + 1] = True
        return starts

    def encode(self, symbols: np.ndarray) -> list[list[int]]:
        symbols = np.asarray(symbols, dtype=np.int64)
        b, n = symbols.shape
        if symbols.size == 0:
            return [[] for _ in range(b)]
        wide = (symbols >= LIMIT).any(axis=1)
        if wide.any():  # rare: a value far outside the fitted range; those rows take the library's path
            out: list[list[int]] = [[] for _ in range(b)]
            slow = np.flatnonzero(wide)
            for i, e in zip(slow, self.bpe.encode_batch_fast(ints_to_strings(symbols[slow]), add_special_tokens=False)):
                out[i] = e.ids
            rest = np.flatnonzero(~wide)
            for i, ids in zip(rest, self._encode(symbols[rest]) if len(rest) else []):
                out[i] = ids
            return out
        return self._encode(symbols)

    def _encode(self, symbols: np.ndarray) -> list[list[int]]:
        if self.merges is None:
            return self._encode_words(symbols)
        b, n = symbols.shape
        starts = self.word_starts(symbols)  # [B, L]
        ends = np.ones_like(starts)  # [B, L] the last code point of its word
        ends[:, :-1] = starts[:, 1:]
        flat = symbols.ravel()
        lens = self.id_lengths[flat] + ends.ravel()  # [B * L] ids of each code point, and a gap after a word
        stop = np.cumsum(lens)
        words = self.id_flat[np.repeat(self.id_offsets[flat] - (stop - lens), lens) + np.arange(stop[-1])]  # [S]
        tokens = self.merges.apply(words)  # [S'] each word's tokens, then a gap
        gaps = np.flatnonzero(tokens == self.merges.gap)  # [W]
        per_word = np.diff(gaps, prepend=-1) - 1  # [W] tokens of each word
        words_per_row = starts.sum(axis=1)  # [B] >= 1: a row's first code point starts a word
        return split_rows(
            tokens[tokens != self.merges.gap], np.add.reduceat(per_word, np.cumsum(words_per_row) - words_per_row)
        )

    def _encode_words(self, symbols: np.ndarray) -> list[list[int]]:
        """Each distinct word through the BPE model (a vocabulary ``Merges`` does not reproduce)."""
        b, n = symbols.shape
        starts = self.word_starts(symbols).ravel()  # [B * L]
        flat = symbols.ravel()
        lens = self.lengths[flat]
        ends = np.cumsum(lens)
        first = ends - lens  # where each code point's stand-ins begin in the row-concatenated text
        text = ints_to_strings(self.flat[np.repeat(self.offsets[flat] - first, lens) + np.arange(ends[-1])][None])[0]
        word_start = first[starts]
        bounds = zip(word_start.tolist(), [*word_start[1:].tolist(), int(ends[-1])])
        index: dict[str, int] = {}
        n_words = len(word_start)
        word = np.fromiter((index.setdefault(text[a:z], len(index)) for a, z in bounds), np.int64, n_words)  # [W]
        model = self.bpe.model
        # Each distinct word merged once. Most of encoding's time is here, in the Rust BPE and the Token objects it
        # returns; neither its batch encode of the words nor one pre-tokenized encode of them all is faster.
        pieces = [[t.id for t in model.tokenize(w)] for w in index]
        piece_len = np.fromiter(map(len, pieces), np.int64, len(pieces))
        piece_ids = np.fromiter(chain.from_iterable(pieces), np.int64, int(piece_len.sum()))
        piece_off = np.cumsum(piece_len) - piece_len
        lens = piece_len[word]
        ends = np.cumsum(lens)
        ids = piece_ids[np.repeat(piece_off[word] - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)]
        words_per_row = starts.reshape(b, n).sum(axis=1)  # >= 1: a row's first symbol starts a word
        return split_rows(ids, np.add.reduceat(lens, np.cumsum(words_per_row) - words_per_row))


def decode_rows(
    decoder: ByteDecoder, bpe: Tokenizer, ids: np.ndarray, counts: np.ndarray, n: int, *, pad: int
) -> tuple[np.ndarray, np.ndarray, list]:
    """Well-formed rows in numpy (``ByteDecoder``); the others through the BPE's decoder, to say why."""
    b, vocab_size = len(counts), bpe.get_vocab_size()
    row_of = np.repeat(np.arange(b), counts)
    bad_id = (ids < 0) | (ids >= vocab_size)
    clean = np.bincount(row_of[bad_id], minlength=b) == 0
    symbols = np.full((b, n), pad, dtype=np.int64)  # repair pads with coefficient 0
    fast, ok = decoder.decode(ids[clean[row_of]], counts[clean], n)
    good = np.flatnonzero(clean)[ok]
    symbols[good] = fast
    valid = np.zeros(b, dtype=bool)
    valid[good] = True
    errors: list[str | None] = [None] * b
    slow = np.flatnonzero(~valid)
    if not len(slow):
        return symbols, valid, errors
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rows = {int(i): ids[starts[i] : starts[i] + counts[i]] for i in slow}
    texts = bpe.decode_batch([rows[i][(rows[i] >= 0) & (rows[i] < vocab_size)].tolist() for i in slow])
    for i, text in zip(slow, texts):
        sym = string_to_ints(text)
        bad = rows[i][(rows[i] < 0) | (rows[i] >= vocab_size)]
        if len(bad):
            errors[i] = f"id {int(bad[0])} is outside [0, {vocab_size})"
        elif (sym == REPLACEMENT).any():
            errors[i] = "the ids spell malformed UTF-8 (a token split a coefficient)"
        else:
            errors[i] = f"the ids spell {len(sym)} coefficients, expected {n}"
        sym = sym[sym != REPLACEMENT]
        symbols[i, : min(len(sym), n)] = sym[:n]
    return symbols, valid, errors
