"""Byte-level FAST's UTF-8 machinery: which byte-level BPE ids may follow which, so that generation always spells
whole, in-alphabet code points.

The reference's byte-level BPE works on the UTF-8 bytes of the coefficient string (each byte shown as a printable
stand-in character, GPT-2's scheme), so one id can end in the middle of a multi-byte code point. ``ByteTables``
precomputes, for each pending partial UTF-8 sequence and each id, whether the id may follow and what it completes;
``Utf8Constraint`` walks those tables during decoding.
"""

from __future__ import annotations

import numpy as np

from tokenizers import Tokenizer

from .constraint import Constraint

REPLACEMENT = 0xFFFD  # what a byte-level decode yields for malformed UTF-8


def _unicode_to_byte() -> dict[str, int]:
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


UNICODE_TO_BYTE: dict[str, int] = _unicode_to_byte()  # the stand-in character of each byte -> the byte


class ByteTables:
    """For each pending partial UTF-8 sequence p and each id: can the id follow, how many whole symbols it
    completes, and what is left pending. Only symbols in the fitted alphabet may be completed.

    ``ok[p, id]``, ``n_chars[p, id]``, ``next_p[p, id]``, and ``min_chars[p]``: the fewest symbols needed to get
    from pending state p back to a clean boundary (0 for the clean state p = 0).
    """

    def __init__(self, ok, n_chars, next_p, min_chars):
        self.ok, self.n_chars, self.next_p, self.min_chars = ok, n_chars, next_p, min_chars

    @classmethod
    def build(cls, bpe: Tokenizer, n_symbols: int) -> ByteTables:
        to_byte = UNICODE_TO_BYTE
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


class ByteDecoder:
    """Byte-level ids -> code points for a whole batch in numpy, exactly as Hugging Face's ``ByteLevel`` decoder
    followed by strict UTF-8: each id's bytes (its stand-in characters mapped back, or, for a raw alphabet token,
    its own UTF-8), concatenated per row, must be well-formed UTF-8 (no overlong forms, no surrogates).

    ``decode`` returns (code points ``[R, n]`` of the rows that are well-formed and spell exactly ``n``, ok ``[B]``);
    the caller handles the other rows (its slow path reports why they fail).
    """

    _NEED = np.array([1] * 0x80 + [0] * 0x42 + [2] * 0x1E + [3] * 0x10 + [4] * 0x05 + [0] * 0x0B)  # by lead byte
    _LEAD_MASK = np.array([0, 0x7F, 0x1F, 0x0F, 0x07])

    def __init__(self, bpe: Tokenizer):
        vocab = bpe.get_vocab()
        pieces = [b""] * len(vocab)
        for token, i in vocab.items():
            stand_ins = all(c in UNICODE_TO_BYTE for c in token)
            pieces[i] = bytes(UNICODE_TO_BYTE[c] for c in token) if stand_ins else token.encode("utf-8")
        self.lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.flat = np.frombuffer(b"".join(pieces), dtype=np.uint8).astype(np.int64)
        # Most ids hold whole characters: a row of those needs no UTF-8 work, only a look-up of code points.
        texts = [_whole_characters(p) for p in pieces]
        self.whole = np.array([t is not None for t in texts])
        self.cp_lengths = np.array([len(t or "") for t in texts], dtype=np.int64)
        self.cp_offsets = np.concatenate([[0], np.cumsum(self.cp_lengths)[:-1]])
        self.cp_flat = np.array([ord(c) for t in texts for c in (t or "")], dtype=np.int64)

    def decode(self, ids: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``ids`` (all in range, rows concatenated), ``counts [B]`` ids per row."""
        b = len(counts)
        row_of = np.repeat(np.arange(b), counts)
        simple = np.bincount(row_of[~self.whole[ids]], minlength=b) == 0  # rows of whole-character ids only
        ok = np.zeros(b, dtype=bool)
        out = np.zeros((b, n), dtype=np.int64)
        if simple.any():
            take = simple[row_of]
            lens = self.cp_lengths[ids[take]]
            ends = np.cumsum(lens)
            cps = self.cp_flat[
                np.repeat(self.cp_offsets[ids[take]] - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)
            ]
            per_row = np.bincount(row_of[take], weights=lens, minlength=b).astype(np.int64)[simple]
            good = per_row == n
            rows = np.flatnonzero(simple)
            ok[rows[good]] = True
            starts = np.concatenate([[0], np.cumsum(per_row)[:-1]])[good]
            out[rows[good]] = cps[starts[:, None] + np.arange(n)]
        if not simple.all():
            rest = ~simple
            cps, rest_ok = self._decode_bytes(ids[rest[row_of]], counts[rest], n)
            rows = np.flatnonzero(rest)[rest_ok]
            ok[rows] = True
            out[rows] = cps
        return out[ok], ok

    def _decode_bytes(self, ids: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The general case: concatenate the rows' bytes and decode them as UTF-8, all rows at once."""
        b = len(counts)
        lens = self.lengths[ids]
        ends = np.cumsum(lens)
        total = int(ends[-1]) if len(ends) else 0
        data = self.flat[np.repeat(self.offsets[ids] - (ends - lens), lens) + np.arange(total)]  # [Y] bytes
        row_bytes = np.bincount(np.repeat(np.arange(b), counts), weights=lens, minlength=b).astype(np.int64)
        row_of_byte = np.repeat(np.arange(b), row_bytes)
        bad_row = np.zeros(b, dtype=bool)
        if total == 0:
            return np.zeros((0, n), dtype=np.int64), bad_row & (n == 0)
        cont = (data & 0xC0) == 0x80
        first = np.concatenate([[0], np.cumsum(row_bytes)[:-1]])[row_bytes > 0]
        bad_row[row_of_byte[first[cont[first]]]] = True  # a row that starts inside a character
        begins = ~cont
        begins[first] = True  # a character never runs on into the next row (its leading continuation bytes)
        starts = np.flatnonzero(begins)  # [C] first byte of each character
        group = np.cumsum(begins) - 1  # [Y] which character each byte belongs to
        size = np.bincount(group, minlength=len(starts))[: len(starts)]
        need = self._NEED[data[starts]]  # [C] the length its lead byte announces (0: not a lead byte)
        pos = np.arange(total) - starts[group] if len(starts) else np.zeros(total, dtype=np.int64)
        need_b = need[group] if len(starts) else np.zeros(total, dtype=np.int64)
        payload = np.where(pos == 0, data & self._LEAD_MASK[need_b], data & 0x3F)
        shift = np.maximum(6 * (need_b - 1 - pos), 0)
        cp = np.bincount(group, weights=payload << shift, minlength=len(starts))[: len(starts)].astype(np.int64)
        canonical = 1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000)
        char_ok = (need == size) & (need > 0) & (canonical == need) & ~((cp >= 0xD800) & (cp <= 0xDFFF))
        row_of_char = row_of_byte[starts]
        bad_row |= np.bincount(row_of_char, weights=~char_ok, minlength=b) > 0
        ok = ~bad_row & (np.bincount(row_of_char, minlength=b) == n)
        return cp[ok[row_of_char]].reshape(-1, n), ok


def _whole_characters(piece: bytes) -> str | None:
    """The characters ``piece`` spells when it is well-formed UTF-8 on its own (None: it splits one)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None
