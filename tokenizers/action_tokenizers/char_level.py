"""Character-level FAST decoding: every id of the vocabulary stands for a whole number of coefficient symbols, so a
batch of id rows decodes by one table look-up (``symbol_table``) and a cut of the concatenated symbols back into
rows (``decode_rows``), with every row that does not spell exactly ``n`` symbols marked and repaired."""

from __future__ import annotations

import numpy as np

from tokenizers import Tokenizer

from .coefficients import string_to_ints


def symbol_table(bpe: Tokenizer, n_symbols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The look-up table of a character-level vocabulary: (flat symbols, offset per id, length per id)."""
    vocab = bpe.get_vocab()
    strings = [""] * len(vocab)
    for token, i in vocab.items():
        strings[i] = token
    lengths = np.array([len(s) for s in strings], dtype=np.int64)
    flat = string_to_ints("".join(strings))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    singles = {ord(s) for s in strings if len(s) == 1}
    if (lengths < 1).any() or not singles.issuperset(range(n_symbols)):
        raise ValueError("the BPE vocabulary lacks a single-symbol id for some coefficient; refit the tokenizer")
    if len(flat) and int(flat.max()) >= n_symbols:  # a config and a BPE file that do not belong together
        raise ValueError(
            f"the BPE vocabulary spells symbol {int(flat.max())}, beyond the {n_symbols}-symbol alphabet (n_symbols) "
            "of its config; the config or the BPE file was changed or mixed with another tokenizer's: save or refit "
            "the tokenizer again"
        )
    return flat, offsets, lengths


def decode_rows(
    table: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray, counts: np.ndarray, n: int, *, pad: int
) -> tuple[np.ndarray, np.ndarray, list]:
    """Whole batch at once: look every id up, then cut the concatenated symbols back into rows.

    ``ids``: all rows' ids, concatenated; ``counts [B]``: ids per row. Returns (symbols [B, n], rows
    padded/truncated for repair; valid [B]; errors).
    """
    flat, offsets, lengths = table
    b = len(counts)
    bad = None
    if len(ids) and (ids.min() < 0 or ids.max() >= len(lengths)):
        row_of = np.repeat(np.arange(b), counts)  # [I] which row each id belongs to
        bad = (ids < 0) | (ids >= len(lengths))
        bad_rows, first = np.unique(row_of[bad], return_index=True)
        bad_ids = ids[bad][first]
        ids, counts = ids[~bad], np.bincount(row_of[~bad], minlength=b)
    lens = lengths[ids]  # [I] symbols per id
    ends = np.cumsum(lens)
    # Output position j of id k reads flat[offsets[k] + (j - start_k)], start_k its first position.
    symbols_all = flat[np.repeat(offsets[ids] - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)]
    row_ends = np.concatenate([[0], ends])[np.cumsum(counts)]  # [B] symbols up to each row's end
    per_row = np.diff(row_ends, prepend=0)  # [B] symbols per row
    valid = per_row == n
    if bad is None and valid.all():  # the common case: every row spells exactly n symbols
        return symbols_all.reshape(b, n), valid, [None] * b
    row_start = row_ends - per_row
    take = np.minimum(per_row, n)
    symbols = np.full((b, n), pad, dtype=np.int64)  # repair pads with coefficient 0
    cols = np.arange(n)
    inside = cols[None, :] < take[:, None]  # [B, n]
    symbols[inside] = symbols_all[(row_start[:, None] + cols[None, :])[inside]]
    errors: list[str | None] = [
        None if ok else f"the ids spell {count} coefficients, expected {n}" for ok, count in zip(valid, per_row)
    ]
    if bad is not None:  # a row with an out-of-range id is invalid even if the rest spells n symbols
        for i, bad_id in zip(bad_rows, bad_ids):
            valid[i], errors[i] = False, f"id {int(bad_id)} is outside [0, {len(lengths)})"
    return symbols, valid, errors
