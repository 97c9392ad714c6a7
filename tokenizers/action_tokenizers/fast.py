"""FAST: DCT over time, scale and round, frequency-major flatten, BPE (Pertsch et al., arXiv:2501.09747).

    chunk [T, D] --dct(axis=time, ortho)--> coef [T, D] --round(coef * scale)--> q [T, D] (ints)
      --flatten C order (all dims of frequency 0, then frequency 1, ...)--> T*D ints
      --(q - min_token) as code points--> a string --BPE--> ids

Two BPE flavours:
* ``byte_level=False`` (default): character-level BPE. Each coefficient is one base symbol, so every id stands
  for a whole number of coefficients, nothing can be dropped, and decoding is a table look-up.
* ``byte_level=True``: the reference's byte-level BPE (Hugging Face ``ByteLevelBPETokenizer`` with the
  reference trainer settings); fitted on the same chunks it gives the reference processor's ids exactly.
  Its ids can end inside a UTF-8 sequence, and a value whose bytes were never seen at fit time is dropped by the
  BPE model: such drops are counted in ``encode_stats.dropped`` and warned about, never silent.

Round trip: with nothing clipped, ``||x - decode(encode(x))||_2 <= 0.5 * sqrt(T * D) / scale`` per chunk
(rounding error at most 0.5 per coefficient, and the orthonormal DCT preserves the 2-norm).
Coefficients outside the fitted range ``[min_token, min_token + n_symbols)`` are clipped to it and counted.
Failure mode: an id sequence that does not spell exactly ``T * D`` coefficients (or, byte-level, malformed
UTF-8) is invalid; ``constraint(...)`` makes that impossible during generation.
"""

from __future__ import annotations

import warnings
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.fft
from tokenizers import ByteLevelBPETokenizer, Tokenizer, models, trainers

from .base import (
    ActionTokenizer,
    DecodeMode,
    DecodeResult,
    as_chunk_batch,
    as_id_rows,
    check_mode,
    finish_decode,
    read_json,
)
from .constraint import Constraint, LengthConstraint

BPE_FILE = "bpe.json"
_REPLACEMENT = 0xFFFD  # what a byte-level decode yields for malformed UTF-8


def dct(chunks: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II over the time axis of ``[B, T, D]``."""
    return scipy.fft.dct(chunks, axis=1, norm="ortho")


def idct(coef: np.ndarray) -> np.ndarray:
    return scipy.fft.idct(coef, axis=1, norm="ortho")


def ints_to_strings(symbols: np.ndarray) -> list[str]:
    """Rows of non-negative ints ``[B, L]`` -> B strings of those code points, without a loop per value."""
    b, n = symbols.shape
    text = np.ascontiguousarray(symbols, dtype="<u4").tobytes().decode("utf-32-le")
    return [text[i * n : (i + 1) * n] for i in range(b)]


def string_to_ints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)


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


class FASTTokenizer(ActionTokenizer):
    name: ClassVar[str] = "fast"

    def __init__(
        self,
        bpe: Tokenizer,
        *,
        scale: float,
        min_token: int,
        n_symbols: int,
        byte_level: bool = False,
        time_horizon: int | None = None,
        action_dim: int | None = None,
    ):
        super().__init__()
        self.bpe = bpe
        self.scale = float(scale)
        self.min_token = int(min_token)
        self.n_symbols = int(n_symbols)  # coefficients min_token .. min_token + n_symbols - 1 are representable
        self.byte_level = bool(byte_level)
        self.time_horizon = time_horizon
        self.action_dim = action_dim
        if not self.byte_level:
            self._token_symbols  # build (and check) the look-up table now, not on first decode

    # --- fitting -------------------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        chunks: np.ndarray,
        scale: float = 10.0,
        vocab_size: int = 1024,
        byte_level: bool = False,
        show_progress: bool = False,
    ) -> FASTTokenizer:
        """Fit on normalised chunks ``[N, T, D]``: the coefficient range, then the BPE merges."""
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
        arr = as_chunk_batch(chunks)
        q = np.around(dct(arr) * scale).astype(np.int64)
        min_token, max_token = int(q.min()), int(q.max())
        n_symbols = max_token - min_token + 1
        # The reference allows max - min == vocab_size; character-level needs one id per symbol.
        limit = vocab_size + 1 if byte_level else vocab_size
        if n_symbols > limit:
            raise ValueError(
                f"the rounded DCT coefficients span {n_symbols} values ({min_token}..{max_token}) but vocab_size "
                f"is {vocab_size}; raise vocab_size to at least {n_symbols} or lower scale (now {scale}), "
                "and check that the chunks are normalised"
            )
        strings = ints_to_strings((q - min_token).reshape(len(q), -1))
        trainer = bpe_trainer(vocab_size, n_symbols, show_progress)
        if byte_level:
            # The reference trains the inner tokenizer of a ByteLevelBPETokenizer with this trainer.
            bpe = ByteLevelBPETokenizer()._tokenizer
        else:
            bpe = Tokenizer(models.BPE())  # no pre-tokenizer: a whole chunk is one word
        bpe.train_from_iterator(strings, trainer=trainer, length=len(strings))
        return cls(
            bpe,
            scale=scale,
            min_token=min_token,
            n_symbols=n_symbols,
            byte_level=byte_level,
            time_horizon=arr.shape[1],
            action_dim=arr.shape[2],
        )

    @property
    def vocab_size(self) -> int:
        return self.bpe.get_vocab_size()

    # --- encoding ------------------------------------------------------------------------------------------
    def coefficients(self, chunks: np.ndarray) -> np.ndarray:
        """Rounded, scaled DCT coefficients ``[B, T, D]`` (ints), before clipping."""
        arr = as_chunk_batch(chunks, action_dim=self.action_dim)
        return np.around(dct(arr) * self.scale).astype(np.int64)

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        q = self.coefficients(chunks)
        symbols = (q - self.min_token).reshape(len(q), -1)
        clipped = (symbols < 0) | (symbols >= self.n_symbols)
        self.encode_stats.chunks += len(q)
        self.encode_stats.values += symbols.size
        self.encode_stats.clipped += int(clipped.sum())
        symbols = np.clip(symbols, 0, self.n_symbols - 1)
        encodings = self.bpe.encode_batch_fast(ints_to_strings(symbols), add_special_tokens=False)
        ids = [e.ids for e in encodings]
        if self.byte_level:
            self._count_drops(ids, symbols.shape[1])
        return ids

    def _count_drops(self, ids: list[list[int]], expected: int) -> None:
        # A lost byte shows as a missing character, or as U+FFFD where it broke a multi-byte character.
        texts = self.bpe.decode_batch(ids, skip_special_tokens=False)
        dropped = sum(max(expected - len(t), 0) + t.count(chr(_REPLACEMENT)) for t in texts)
        if dropped:
            self.encode_stats.dropped += dropped
            warnings.warn(
                f"byte-level FAST dropped {dropped} coefficient(s) whose bytes were never seen at fit time; "
                "those chunks will not decode. Use byte_level=False, which cannot drop values.",
                stacklevel=3,
            )

    # --- decoding ------------------------------------------------------------------------------------------
    @cached_property
    def _token_symbols(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Character-level look-up table: (flat symbols, offset per id, length per id)."""
        vocab = self.bpe.get_vocab()
        strings = [""] * len(vocab)
        for token, i in vocab.items():
            strings[i] = token
        lengths = np.array([len(s) for s in strings], dtype=np.int64)
        flat = string_to_ints("".join(strings))
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        singles = {ord(s) for s in strings if len(s) == 1}
        if (lengths < 1).any() or not singles.issuperset(range(self.n_symbols)):
            raise ValueError("the BPE vocabulary lacks a single-symbol id for some coefficient; refit the tokenizer")
        return flat, offsets, lengths

    def _decode_char_level(self, rows: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, list]:
        """Whole batch at once: look every id up, then cut the concatenated symbols back into rows.

        Returns (symbols [B, n] with rows padded/truncated for repair, valid [B], errors).
        """
        flat, offsets, lengths = self._token_symbols
        b = len(rows)
        counts = np.array([len(r) for r in rows])
        ids = np.concatenate(rows) if counts.sum() else np.zeros(0, dtype=np.int64)
        row_of = np.repeat(np.arange(b), counts)  # [I] which row each id belongs to
        bad = (ids < 0) | (ids >= len(lengths))
        bad_rows = np.unique(row_of[bad])
        ids, row_of = ids[~bad], row_of[~bad]
        lens = lengths[ids]  # [I] symbols per id
        ends = np.cumsum(lens)
        # Output position j of id k reads flat[offsets[k] + (j - start_k)], start_k its first position.
        symbols_all = flat[np.repeat(offsets[ids] - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)]
        per_row = np.bincount(row_of, weights=lens, minlength=b).astype(np.int64)  # [B] symbols per row
        row_start = np.concatenate([[0], np.cumsum(per_row)[:-1]])
        take = np.minimum(per_row, n)
        pad = -self.min_token  # repair pads with coefficient 0
        symbols = np.full((b, n), pad, dtype=np.int64)
        cols = np.arange(n)
        inside = cols[None, :] < take[:, None]  # [B, n]
        symbols[inside] = symbols_all[(row_start[:, None] + cols[None, :])[inside]]
        valid = per_row == n
        errors: list[str | None] = [
            None if ok else f"the ids spell {count} coefficients, expected {n}" for ok, count in zip(valid, per_row)
        ]
        for i in bad_rows:
            valid[i] = False
            errors[i] = f"id {int(rows[i][(rows[i] < 0) | (rows[i] >= len(lengths))][0])} is outside [0, {len(lengths)})"
        return symbols, valid, errors

    def _decode_byte_level(self, rows: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, list]:
        vocab_size = self.vocab_size
        valid = np.ones(len(rows), dtype=bool)
        errors: list[str | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            bad = (row < 0) | (row >= vocab_size)
            if bad.any():
                valid[i], errors[i] = False, f"id {int(row[bad][0])} is outside [0, {vocab_size})"
                rows[i] = row[~bad]
        texts = self.bpe.decode_batch([r.tolist() for r in rows], skip_special_tokens=False)
        symbols = np.full((len(rows), n), -self.min_token, dtype=np.int64)
        for i, text in enumerate(texts):
            sym = string_to_ints(text)
            if valid[i] and (sym == _REPLACEMENT).any():
                valid[i], errors[i] = False, "the ids spell malformed UTF-8 (a token split a coefficient)"
            if valid[i] and len(sym) != n:
                valid[i], errors[i] = False, f"the ids spell {len(sym)} coefficients, expected {n}"
            sym = sym[sym != _REPLACEMENT]
            symbols[i, : min(len(sym), n)] = sym[:n]
        return symbols, valid, errors

    def decode(
        self, ids, time_horizon: int | None = None, action_dim: int | None = None, mode: DecodeMode = "mark"
    ) -> DecodeResult:
        check_mode(mode)
        t, d = self._resolve_shape(time_horizon, action_dim)
        rows = as_id_rows(ids)
        decode_rows = self._decode_byte_level if self.byte_level else self._decode_char_level
        symbols, valid, errors = decode_rows(rows, t * d)
        coef = (symbols + self.min_token).reshape(len(rows), t, d) / self.scale
        return finish_decode(idct(coef), valid, errors, mode)

    # --- constraint ----------------------------------------------------------------------------------------
    def constraint(self, time_horizon: int | None = None, action_dim: int | None = None) -> Constraint:
        t, d = self._resolve_shape(time_horizon, action_dim)
        if self.byte_level:
            return Utf8Constraint(self._byte_tables, t * d)
        return LengthConstraint(self._token_symbols[2], t * d)

    @cached_property
    def _byte_tables(self) -> ByteTables:
        return ByteTables.build(self.bpe, self.n_symbols)

    # --- files ---------------------------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "min_token": self.min_token,
            "n_symbols": self.n_symbols,
            "byte_level": self.byte_level,
            "time_horizon": self.time_horizon,
            "action_dim": self.action_dim,
        }

    def _save_files(self, directory: Path) -> None:
        self.bpe.save(str(directory / BPE_FILE))

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> FASTTokenizer:
        return cls(
            load_bpe(directory / BPE_FILE),
            scale=config["scale"],
            min_token=config["min_token"],
            n_symbols=config["n_symbols"],
            byte_level=config["byte_level"],
            time_horizon=config.get("time_horizon"),
            action_dim=config.get("action_dim"),
        )

    @classmethod
    def from_reference(cls, directory: str | Path) -> FASTTokenizer:
        """Load a local copy of the reference processor's files, executing nothing.

        Needs ``processor_config.json`` and ``tokenizer.json``, the latter beside it or in ``bpe_tokenizer/``
        (the layout transformers 5 writes). The reference does not store the alphabet size; it is read off the
        vocabulary (its single-character tokens) and only used to clip out-of-range coefficients.
        """
        directory = Path(directory)
        config = read_json(directory / "processor_config.json", "reference FAST processor")
        candidates = [directory / "tokenizer.json", directory / "bpe_tokenizer" / "tokenizer.json"]
        bpe_path = next((p for p in candidates if p.is_file()), None)
        if bpe_path is None:
            raise ValueError(f"no tokenizer.json in {directory} or {directory / 'bpe_tokenizer'}; copy the BPE files too")
        missing = [k for k in ("scale", "min_token") if k not in config]
        if missing:
            raise ValueError(f"{directory / 'processor_config.json'} lacks {', '.join(missing)}")
        bpe = load_bpe(bpe_path)
        singles = [ord(tok) for tok in bpe.get_vocab() if len(tok) == 1]
        byte_chars = set(ByteTables.unicode_to_byte())
        raw = [c for c in singles if c not in byte_chars]  # initial-alphabet symbols that are not byte stand-ins
        n_symbols = max(raw) + 1 if raw else int(config.get("vocab_size") or bpe.get_vocab_size()) + 1
        return cls(
            bpe,
            scale=config["scale"],
            min_token=config["min_token"],
            n_symbols=n_symbols,
            byte_level=True,
            time_horizon=config.get("time_horizon"),
            action_dim=config.get("action_dim"),
        )


def load_bpe(path: Path) -> Tokenizer:
    if not path.is_file():
        raise ValueError(f"BPE file {path} is missing; save the tokenizer again")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for malformed files
        raise ValueError(f"BPE file {path} is corrupt ({err}); save the tokenizer again") from None


# --- the byte-level constraint -------------------------------------------------------------------------------
class ByteTables:
    """For each pending partial UTF-8 sequence p and each id: can the id follow, how many whole symbols it
    completes, and what is left pending. Only symbols in the fitted alphabet may be completed.

    ``ok[p, id]``, ``n_chars[p, id]``, ``next_p[p, id]``, and ``min_chars[p]``: the fewest symbols needed to get
    from pending state p back to a clean boundary (0 for the clean state p = 0).
    """

    def __init__(self, ok, n_chars, next_p, min_chars):
        self.ok, self.n_chars, self.next_p, self.min_chars = ok, n_chars, next_p, min_chars

    @staticmethod
    def unicode_to_byte() -> dict[str, int]:
        """Inverse of the byte-level pre-tokenizer's byte -> printable character table (GPT-2's scheme)."""
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
        table, extra = {}, 0
        for b in range(256):
            if b in printable:
                table[chr(b)] = b
            else:
                table[chr(256 + extra)] = b
                extra += 1
        return table

    @classmethod
    def build(cls, bpe: Tokenizer, n_symbols: int) -> ByteTables:
        to_byte = cls.unicode_to_byte()
        vocab = bpe.get_vocab()
        token_bytes: list[bytes | None] = [None] * len(vocab)
        for token, i in vocab.items():
            if all(c in to_byte for c in token):
                token_bytes[i] = bytes(to_byte[c] for c in token)
            # else: a raw initial-alphabet character that encoding never produces; never allowed.
        encodings = [chr(s).encode("utf-8") for s in range(n_symbols)]
        prefixes = sorted({e[:k] for e in encodings for k in range(1, len(e))}, key=lambda p: (len(p), p))
        pending = [b""] + prefixes
        index = {p: i for i, p in enumerate(pending)}
        symbols = set(encodings)
        starts_of = set(prefixes)
        n_p, n_v = len(pending), len(vocab)
        ok = np.zeros((n_p, n_v), dtype=bool)
        n_chars = np.zeros((n_p, n_v), dtype=np.int64)
        next_p = np.zeros((n_p, n_v), dtype=np.int64)
        for pi, prefix in enumerate(pending):
            for tid, tb in enumerate(token_bytes):
                if tb is None:
                    continue
                data, pos, count, good = prefix + tb, 0, 0, True
                while pos < len(data):
                    length = _utf8_length(data[pos])
                    piece = data[pos : pos + length]
                    if length and len(piece) == length and piece in symbols:
                        pos, count = pos + length, count + 1
                    elif length and len(piece) < length and piece in starts_of:
                        break  # an incomplete but completable symbol stays pending
                    else:
                        good = False
                        break
                if good:
                    ok[pi, tid], n_chars[pi, tid], next_p[pi, tid] = True, count, index[data[pos:]]
        # Fewest symbols to return to a clean boundary; drop moves into pending states that cannot get back.
        inf = np.iinfo(np.int64).max // 4
        min_chars = np.full(n_p, inf, dtype=np.int64)
        min_chars[0] = 0
        for _ in range(n_p + 1):
            cost = np.where(ok, n_chars + min_chars[next_p], inf).min(axis=1)
            cost[0] = 0
            if np.array_equal(cost, min_chars):
                break
            min_chars = cost
        ok &= min_chars[next_p] < inf
        return cls(ok, n_chars, next_p, min_chars)


def _utf8_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC0 <= lead < 0xE0:
        return 2
    if 0xE0 <= lead < 0xF0:
        return 3
    if 0xF0 <= lead < 0xF8:
        return 4
    return 0  # a continuation byte cannot start a symbol


class Utf8Constraint(Constraint):
    """Byte-level FAST: the state is (symbols still to complete, pending partial UTF-8 sequence).

    An id is allowed when it continues valid UTF-8 of in-alphabet symbols and, with the fewest symbols needed to
    close what it leaves pending, still fits in what remains. States are ints ``remaining * P + pending``.
    """

    def __init__(self, tables: ByteTables, total: int):
        self.tables = tables
        self.total = int(total)
        self.n_pending = len(tables.min_chars)
        self.vocab_size = tables.ok.shape[1]
        self.max_length = self.total * 4  # at most 4 bytes per symbol, at least one byte per id
        self._cost = tables.n_chars + tables.min_chars[tables.next_p]  # [P, V]
        self._masks: dict[int, np.ndarray] = {}

    def start(self) -> int:
        return self.total * self.n_pending

    def allowed(self, state: int) -> np.ndarray:
        mask = self._masks.get(state)
        if mask is None:
            remaining, p = divmod(state, self.n_pending)
            mask = self._masks[state] = self.tables.ok[p] & (self._cost[p] <= remaining)
            mask.flags.writeable = False
        return mask

    def _next(self, state: int, token_id: int) -> int:
        remaining, p = divmod(state, self.n_pending)
        remaining -= int(self.tables.n_chars[p, token_id])
        return remaining * self.n_pending + int(self.tables.next_p[p, token_id])

    def done(self, state: int) -> bool:
        return state == 0
