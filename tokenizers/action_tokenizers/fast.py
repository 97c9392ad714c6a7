"""FAST: DCT over time, quantise, flatten, BPE (Pertsch et al., arXiv:2501.09747), plus measured improvements.

    chunk [T, D] --dct(axis=time, ortho)--> coef [T, D] --round(coef * scale), deadzone--> q [T, D] (ints)
      --flatten: dimension-major (dim 0's frequencies 0..T-1, then dim 1's, ...; the default)
                 or frequency-major (C order: every dim's frequency 0 first; the reference)--> T*D ints
      --(q - min_token) as code points--> a string --BPE--> ids

Two BPE flavours:
* ``byte_level=False`` (default): character-level BPE. Each coefficient is one base symbol, so every id stands
  for a whole number of coefficients, nothing can be dropped, and decoding is a table look-up. The vocabulary is
  trained by Hugging Face's BPE trainer; a chunk is encoded by longest match over it (``longest_match.py``,
  vectorised over the batch), which spells fewer ids than replaying the merges and runs several times faster. Defaults
  ``order="dimension"``, ``deadzone=0.2``: on real data they need fewer tokens at equal RMSE than the reference
  (``results/rate_distortion/``): a dimension's spectrum is smooth and decays, so its run of coefficients merges
  well, and a slightly wider zero bin makes longer zero runs for little error.
* ``byte_level=True``: the reference's byte-level BPE (Hugging Face ``ByteLevelBPETokenizer`` with the
  reference trainer settings), frequency-major and plain rounding: fitted on the same chunks it gives the
  reference processor's ids exactly, also for values outside the fitted range (clipped below only, as there).
  A batch is encoded by ``byte_level.py`` (the pre-tokenizer's split in numpy, the merges applied to all words at
  once by ``merges.py``): the same ids as the BPE's own batch encode, in a fraction of the time.
  Its ids can end inside a UTF-8 sequence, and a value whose bytes were never seen at fit time is dropped by the
  BPE model: such drops are counted in ``encode_stats.dropped`` and warned about, never silent.

Round trip: with nothing clipped, ``||x - decode(encode(x))||_2 <= (0.5 + deadzone) * sqrt(T * D) / scale`` per
chunk (quantisation error at most 0.5 + deadzone per coefficient; the orthonormal DCT preserves the 2-norm).
Coefficients outside the fitted range ``[min_token, min_token + n_symbols)`` are clipped to it and counted. The clip
is done on the floats, before any cast to integers, and values far outside (beyond ``value_limit(T)``, where a
coefficient of theirs is out of range anyway) are first limited to it, so that the DCT can neither overflow nor
spread its rounding noise over the other coefficients: a huge value's dimension decodes as its clipped coefficients
spell it (valid, counted), and the other dimensions are unharmed.
Failure mode: an id sequence that does not spell exactly ``T * D`` coefficients (or, byte-level, malformed
UTF-8) is invalid; ``constraint(...)`` makes that impossible during generation.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tokenizers import ByteLevelBPETokenizer, Tokenizer, models

from . import byte_level, char_level, rate
from .base import (
    CONFIG_NAME,
    MAX_ACTION_DIM,
    MAX_TIME_HORIZON,
    MAX_VOCAB_SIZE,
    ActionTokenizer,
    DecodeMode,
    DecodeResult,
    EncodeStats,
    as_chunk_batch,
    as_id_batch,
    check_mode,
    check_saved,
    check_size,
    finish_decode,
)
from .byte_level import ByteLevelEncoder
from .coefficients import (
    SCALE_RANGE,
    dct,
    flatten,
    idct,
    ints_to_strings,
    quantize,
    scale_for_rmse,
    split_rows,
    to_symbols,
    unflatten,
)
from .constraint import Constraint, LengthConstraint
from .longest_match import Trie
from .rate import AUTO
from .reference import bpe_trainer, load_bpe, read_reference
from .utf8 import UNICODE_TO_BYTE, ByteDecoder, ByteTables, Utf8Constraint

BPE_FILE = "bpe.json"
DEFAULT_DEADZONE = 0.2  # measured on real data: see results/rate_distortion/
BYTE_LEVEL_TOP = 0x10FFFF  # byte-level symbols are code points: the largest there is
SURROGATES = (0xD800, 0xDFFF)  # code points no string can hold; a byte-level symbol there becomes 0xD7FF
MAX_SYMBOLS = SURROGATES[0]  # a FAST alphabet's size: its symbols are code points below the surrogates
# |min_token|, the smallest rounded coefficient: a [-1, 1] chunk of MAX_TIME_HORIZON steps at the largest scale has
# coefficients below sqrt(1024) * 1e4 = 327680, so anything beyond 2^20 was not fitted on normalised chunks.
MAX_MIN_TOKEN = 1 << 20


ORDERS = ("dimension", "frequency")


def _alphabet(arr: np.ndarray, q: np.ndarray, scale: float, auto: bool):
    """The rounded coefficients ``q`` of chunks ``arr`` checked (finite, an alphabet a FAST tokenizer can hold):
    ``(q, min_token, max_token, choices)``; with ``auto`` the alphabet is the central range ``rate.auto_alphabet``
    chooses, ``q`` clipped to it and the choice said in ``choices``."""
    if not np.isfinite(q).all():
        raise ValueError(
            f"the DCT coefficients of the chunks overflow (values up to {np.abs(arr).max():.3g}); check that the "
            "chunks are normalised"
        )
    min_token, max_token = int(q.min()), int(q.max())
    choices: dict[str, tuple[Any, str]] = {}
    if auto:
        alphabet = rate.auto_alphabet(q)
        min_token, max_token = alphabet.min_token, alphabet.max_token
        q = np.clip(q, min_token, max_token)
        choices["alphabet"] = (f"{min_token}..{max_token}", alphabet.why)
    n_symbols = max_token - min_token + 1
    if n_symbols > MAX_SYMBOLS or max(-min_token, max_token) > MAX_MIN_TOKEN:  # symbols are code points
        raise ValueError(
            f"the rounded DCT coefficients span {n_symbols} values ({min_token}..{max_token}), more than the "
            f"{MAX_SYMBOLS} a FAST alphabet can hold (MAX_SYMBOLS, and |coefficient| <= {MAX_MIN_TOKEN}); lower "
            f"scale (now {scale}) and check that the chunks are normalised"
        )
    return q, min_token, max_token, choices


class FASTTokenizer(ActionTokenizer):
    name: ClassVar[str] = "fast"

    @dataclass(frozen=True)
    class Options:
        """``fit``'s options: ``FASTTokenizer.fit(chunks, **asdict(FASTTokenizer.Options()))`` is ``fit(chunks)``."""

        scale: float = field(
            default=10.0,
            metadata={"help": "DCT coefficients are scaled by this and rounded: higher is finer and costs more tokens"},
        )
        vocab_size: int | str | None = field(
            default=AUTO,
            metadata={
                "help": "BPE vocabulary; 'auto': chosen from the fitting chunks (action_tokenizers.rate: the "
                "largest whose typical id is seen often enough, with outlying coefficients clipped); "
                "None: the published rule, max(1024, 2**ceil(log2(n_symbols + 256)))"
            },
        )
        byte_level: bool = field(
            default=False,
            metadata={
                "help": "the published byte-level BPE, reproducing its ids exactly, instead of character-level BPE"
            },
        )
        order: str | None = field(
            default=None,
            metadata={
                "help": "coefficient order: 'dimension' (each dim's frequencies in turn) or 'frequency' "
                "(published); None: dimension, or frequency when byte_level"
            },
        )
        deadzone: float | None = field(
            default=None,
            metadata={
                "help": "coefficients below (0.5 + deadzone) / scale become 0, in [0, 0.5); None: 0.2, or 0 "
                "when byte_level"
            },
        )
        target_rmse: float | None = field(
            default=None,
            metadata={
                "help": "if set, choose the scale whose quantisation RMSE on the fitting chunks meets this "
                "(scale is then ignored)"
            },
        )
        show_progress: bool = field(default=False, metadata={"help": "show the BPE trainer's progress bar"})

    def __init__(
        self,
        bpe: Tokenizer,
        *,
        scale: float,
        min_token: int,
        n_symbols: int,
        byte_level: bool = False,
        order: str = "frequency",
        deadzone: float = 0.0,
        time_horizon: int | None = None,
        action_dim: int | None = None,
    ):
        super().__init__()
        check_scale(scale)
        if not isinstance(min_token, (int, np.integer)) or abs(min_token) > MAX_MIN_TOKEN:
            raise ValueError(
                f"min_token must be an integer within +-{MAX_MIN_TOKEN} (MAX_MIN_TOKEN), got {min_token!r}; fit the "
                "tokenizer on normalised chunks"
            )
        check_size("n_symbols", n_symbols, 1, MAX_SYMBOLS, "MAX_SYMBOLS")
        if time_horizon is not None:
            check_size("time_horizon", time_horizon, 1, MAX_TIME_HORIZON, "MAX_TIME_HORIZON")
        if action_dim is not None:
            check_size("action_dim", action_dim, 1, MAX_ACTION_DIM, "MAX_ACTION_DIM")
        check_size("the BPE's vocabulary size", bpe.get_vocab_size(), 1, MAX_VOCAB_SIZE, "MAX_VOCAB_SIZE")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if not 0.0 <= deadzone < 0.5:
            raise ValueError(f"deadzone must be in [0, 0.5), got {deadzone!r}")
        self.bpe = bpe
        self.scale = float(scale)
        self.min_token = int(min_token)
        self.n_symbols = int(n_symbols)  # coefficients min_token .. min_token + n_symbols - 1 are representable
        self.byte_level = bool(byte_level)
        self.order = order
        self.deadzone = float(deadzone)
        self.time_horizon = time_horizon
        self.action_dim = action_dim
        if not self.byte_level:
            self._token_symbols  # build (and check) the look-up table now, not on first decode

    # --- fitting -------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, chunks: np.ndarray, **options: Any) -> FASTTokenizer:
        """Fit on normalised chunks ``[N, T, D]``: the coefficient range, then the BPE merges; ``options``:
        ``FASTTokenizer.Options``. With ``vocab_size="auto"`` both are chosen from the chunks
        (``action_tokenizers.rate``; byte-level keeps the published rule), and ``fit_choices`` says what was chosen
        and why."""
        o = cls.fit_options(options)
        scale, vocab_size, byte_level, order, deadzone = o.scale, o.vocab_size, o.byte_level, o.order, o.deadzone
        target_rmse, show_progress = o.target_rmse, o.show_progress
        check_scale(scale)
        auto = isinstance(vocab_size, str)
        if auto and vocab_size != AUTO:
            raise ValueError(
                f"vocab_size must be an integer, {AUTO!r} or None (the published rule), got {vocab_size!r}"
            )
        if auto and byte_level:
            vocab_size = auto = None  # the published byte-level tokenizer, as published
        if vocab_size is not None and not auto:
            check_size("vocab_size", vocab_size, 2, MAX_VOCAB_SIZE, "MAX_VOCAB_SIZE")
        order = order if order is not None else ("frequency" if byte_level else "dimension")
        deadzone = deadzone if deadzone is not None else (0.0 if byte_level else DEFAULT_DEADZONE)
        arr = as_chunk_batch(chunks)
        coef = dct(arr)
        if target_rmse is not None:
            scale = scale_for_rmse(coef, target_rmse, deadzone)
        q, min_token, max_token, choices = _alphabet(arr, quantize(coef, scale, deadzone), scale, auto)
        n_symbols = max_token - min_token + 1
        strings = ints_to_strings(flatten((q - min_token).astype(np.int64), order))
        shape = dict(
            scale=scale,
            min_token=min_token,
            n_symbols=n_symbols,
            byte_level=byte_level,
            order=order,
            deadzone=deadzone,
            time_horizon=arr.shape[1],
            action_dim=arr.shape[2],
        )

        def train(size: int) -> FASTTokenizer:
            trainer = bpe_trainer(size, n_symbols, show_progress)
            # Byte-level: the reference trains the inner tokenizer of a ByteLevelBPETokenizer with this trainer;
            # character-level has no pre-tokenizer: a whole chunk is one word.
            bpe = ByteLevelBPETokenizer()._tokenizer if byte_level else Tokenizer(models.BPE())
            bpe.train_from_iterator(strings, trainer=trainer, length=len(strings))
            return cls(bpe, **shape)

        if auto:
            fitted: dict[int, FASTTokenizer] = {}

            def spell(size: int) -> np.ndarray:
                fitted[size] = train(size)
                return rate.id_counts(fitted[size].encode(arr), fitted[size].vocab_size)

            size, why = rate.choose_vocab_size(n_symbols, len(arr), arr.shape[1], spell)
            tok = fitted[size]
            choices["vocab_size"] = (tok.vocab_size, why)  # what was built: fewer ids when the merges ran out
            tok.encode_stats = EncodeStats()  # the choice's own encodes are not the caller's
            tok.fit_choices = choices
            return tok
        if vocab_size is None:
            vocab_size = max(1024, int(2 ** math.ceil(math.log2(n_symbols + 256))))
        # The reference allows max - min == vocab_size; character-level needs one id per symbol.
        limit = vocab_size + 1 if byte_level else vocab_size
        if n_symbols > limit:
            raise ValueError(
                f"the rounded DCT coefficients span {n_symbols} values ({min_token}..{max_token}) but vocab_size "
                f"is {vocab_size}; raise vocab_size to at least {n_symbols} (or pass 'auto', which clips outlying coefficients), lower scale (now "
                f"{scale}), and check that the chunks are normalised"
            )
        return train(vocab_size)

    @property
    def vocab_size(self) -> int:
        return self.bpe.get_vocab_size()

    # --- encoding ------------------------------------------------------------------------------------------
    @property
    def top_symbol(self) -> int:
        """Symbols are clipped to ``[0, top_symbol]``: the fitted alphabet, or (byte-level) any code point."""
        return BYTE_LEVEL_TOP if self.byte_level else self.n_symbols - 1

    def value_limit(self, time_horizon: int) -> float:
        """Chunk values are limited to +-this before the DCT. A value beyond it puts a coefficient of its dimension
        out of range anyway (the orthonormal DCT keeps each dimension's 2-norm), so the chunk is clipped and counted
        either way; limiting it first keeps the DCT finite and its rounding noise (relative to the largest value)
        far below one quantisation step, so that only the coefficients the value reaches are clipped."""
        reach = max(abs(self.min_token), abs(self.min_token + self.top_symbol)) + 1  # |rounded coef| that clips
        return math.sqrt(time_horizon) * reach / self.scale

    def _rounded(self, chunks: np.ndarray) -> np.ndarray:
        """Rounded, scaled DCT coefficients ``[B, T, D]`` as integer-valued floats, not yet clipped."""
        arr = as_chunk_batch(chunks, time_horizon=self.time_horizon, action_dim=self.action_dim)
        limit = self.value_limit(arr.shape[1])
        if max(-arr.min(), arr.max()) > limit:
            arr = np.clip(arr, -limit, limit)
        return quantize(dct(arr), self.scale, self.deadzone)

    def coefficients(self, chunks: np.ndarray) -> np.ndarray:
        """Quantised, scaled DCT coefficients ``[B, T, D]`` (ints), before clipping to the fitted range (values beyond
        ``value_limit`` are limited first, so nothing overflows)."""
        return self._rounded(chunks).astype(np.int64)

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        # Character-level clips to the fitted alphabet. Byte-level clips below only, like the reference: a value
        # above the fitted range goes through as its code point (and may be dropped by the BPE: counted below), up to
        # the largest code point; one on a UTF-16 surrogate (where the reference fails too) becomes 0xD7FF, counted.
        symbols, clipped = to_symbols(flatten(self._rounded(chunks), self.order), self.min_token, self.top_symbol)
        if self.byte_level and symbols.size and symbols.max() >= SURROGATES[0]:
            surrogate = (symbols >= SURROGATES[0]) & (symbols <= SURROGATES[1])
            clipped += int(surrogate.sum())
            symbols[surrogate] = SURROGATES[0] - 1
        self.encode_stats.chunks += len(symbols)
        self.encode_stats.values += symbols.size
        self.encode_stats.clipped += clipped
        if self.byte_level:
            self._count_drops(symbols)
            if self._byte_encoder is not None:  # the same ids as the BPE's own batch encode, several times faster
                return self._byte_encoder.encode(symbols)
            return [e.ids for e in self.bpe.encode_batch_fast(ints_to_strings(symbols), add_special_tokens=False)]
        # Character-level: the longest vocabulary entry at each position (fewer ids than replaying the merges).
        ids, counts = self._trie.segment(symbols)
        return split_rows(ids, counts)

    @cached_property
    def _byte_encoder(self) -> ByteLevelEncoder | None:
        return ByteLevelEncoder(self.bpe) if byte_level.supported(self.bpe) else None

    @cached_property
    def _trie(self) -> Trie:
        return Trie.build(*self._token_symbols, self.n_symbols)

    def _count_drops(self, symbols: np.ndarray) -> None:
        # The BPE model silently skips a byte whose stand-in character is not in its vocabulary.
        inside = symbols < self.n_symbols
        dropped = int(self._droppable[symbols[inside]].sum()) if self._droppable.any() else 0
        if not inside.all():  # each occurrence counts, not each distinct value
            values, times = np.unique(symbols[~inside], return_counts=True)
            dropped += sum(int(n) for s, n in zip(values.tolist(), times) if self._drops(s))
        if dropped:
            self.encode_stats.dropped += dropped
            warnings.warn(
                f"byte-level FAST dropped {dropped} coefficient(s) whose bytes were never seen at fit time; "
                "those chunks will not decode. Use byte_level=False, which cannot drop values.",
                stacklevel=3,
            )

    def _drops(self, symbol: int) -> bool:
        return not set(chr(symbol).encode("utf-8")) <= self._known_bytes

    @cached_property
    def _known_bytes(self) -> set[int]:
        vocab = self.bpe.get_vocab()
        return {b for c, b in UNICODE_TO_BYTE.items() if c in vocab}

    @cached_property
    def _droppable(self) -> np.ndarray:
        """``[n_symbols]`` bool: the symbol has a UTF-8 byte the byte-level vocabulary cannot represent."""
        return np.array([self._drops(s) for s in range(self.n_symbols)], dtype=bool)

    # --- decoding ------------------------------------------------------------------------------------------
    @cached_property
    def _token_symbols(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Character-level look-up table: (flat symbols, offset per id, length per id)."""
        return char_level.symbol_table(self.bpe, self.n_symbols)

    def _decode_char_level(self, ids: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, list]:
        return char_level.decode_rows(self._token_symbols, ids, counts, n, pad=-self.min_token)

    def _decode_byte_level(self, ids: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, list]:
        return byte_level.decode_rows(self._byte_decoder, self.bpe, ids, counts, n, pad=-self.min_token)

    @cached_property
    def _byte_decoder(self) -> ByteDecoder:
        return ByteDecoder(self.bpe)

    def decode(
        self, ids, time_horizon: int | None = None, action_dim: int | None = None, mode: DecodeMode = "mark"
    ) -> DecodeResult:
        check_mode(mode)
        t, d = self._resolve_shape(time_horizon, action_dim)
        flat, counts = as_id_batch(ids)
        decode_rows = self._decode_byte_level if self.byte_level else self._decode_char_level
        symbols, valid, errors = decode_rows(flat, counts, t * d)
        coef = unflatten(symbols + self.min_token, self.order, t, d) / self.scale
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
            "order": self.order,
            "deadzone": self.deadzone,
            "time_horizon": self.time_horizon,
            "action_dim": self.action_dim,
        }

    def _save_files(self, directory: Path) -> None:
        self.bpe.save(str(directory / BPE_FILE))

    SAVED_FIELDS: ClassVar[dict[str, str]] = {
        "scale": "number>0",
        "min_token": "int",
        "n_symbols": "int>=1",
        "byte_level": "bool",
        "order": "in:dimension,frequency?",
        "deadzone": "number[0,0.5)?",
        "time_horizon": "int>=1?",
        "action_dim": "int>=1?",
    }

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> FASTTokenizer:
        config = check_saved(config, directory / CONFIG_NAME, cls.SAVED_FIELDS)
        bpe = load_bpe(directory / BPE_FILE)
        try:
            return cls(
                bpe,
                scale=config["scale"],
                min_token=config["min_token"],
                n_symbols=config["n_symbols"],
                byte_level=config["byte_level"],
                order=config.get("order", "frequency"),  # files written before these options: the reference's
                deadzone=config.get("deadzone", 0.0),
                time_horizon=config.get("time_horizon"),
                action_dim=config.get("action_dim"),
            )
        except ValueError as err:  # e.g. a BPE whose vocabulary does not cover n_symbols
            raise ValueError(f"{directory}: {err}") from None

    @classmethod
    def from_reference(cls, directory: str | Path) -> FASTTokenizer:
        """Load a local copy of the reference processor's files, executing nothing.

        Needs ``processor_config.json`` and ``tokenizer.json``, the latter beside it or in ``bpe_tokenizer/``
        (the layout transformers 5 writes). The reference does not store the alphabet size; it is read off the
        vocabulary (its single-character tokens, ``read_reference``) and bounds the decoding constraint.
        """
        bpe, config, n_symbols = read_reference(Path(directory))
        try:
            return cls(
                bpe,
                scale=config["scale"],
                min_token=config["min_token"],
                n_symbols=n_symbols,
                byte_level=True,
                order="frequency",
                deadzone=0.0,
                time_horizon=config.get("time_horizon"),
                action_dim=config.get("action_dim"),
            )
        except ValueError as err:
            raise ValueError(f"{directory}: {err}") from None


def check_scale(scale: Any) -> float:
    """``scale`` as a float in ``SCALE_RANGE``, else a one-line ``ValueError`` naming the range."""
    low, high = SCALE_RANGE
    number = isinstance(scale, (int, float, np.integer, np.floating)) and not isinstance(scale, bool)
    if not (number and np.isfinite(scale) and low <= scale <= high):
        raise ValueError(
            f"scale must be a number in [{low:g}, {high:g}] (SCALE_RANGE), got {scale!r}; 10 is the published value"
        )
    return float(scale)
