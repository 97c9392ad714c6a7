"""The batched byte-level encoder cuts words exactly like Hugging Face's ByteLevel pre-tokenizer and gives the ids of
``encode_batch_fast``, on FAST's rows and on random strings of the characters where GPT-2's pattern has special
cases (spaces before words, other whitespace, runs of whitespace, contractions, non-ASCII letters and digits)."""

import numpy as np
import pytest
from action_tokenizers.byte_level import LIMIT, ByteLevelEncoder, supported
from action_tokenizers.coefficients import flatten, ints_to_strings
from hypothesis import given, settings
from hypothesis import strategies as st

TRICKY = [ord(c) for c in " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0'strevlmdxSaZ019!?-_"]
TRICKY += [ord(c) for c in "\x00\x7f\xa1\xad\xe9\u0300\u0660\u0669\u07ff"]  # controls, Latin-1, marks, Arabic digits


@pytest.fixture(scope="module")
def encoder(fast_bl_wide):
    assert supported(fast_bl_wide.bpe)
    return ByteLevelEncoder(fast_bl_wide.bpe)


def _bpe_starts(bpe, row) -> list[int]:
    return [a for _, (a, _) in bpe.pre_tokenizer.pre_tokenize_str("".join(map(chr, row)))]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 40))
def test_word_starts_equal_the_pre_tokenizer(encoder, seed, width):
    rng = np.random.default_rng(seed)
    rows = np.array(TRICKY)[rng.integers(0, len(TRICKY), (20, width))]
    starts = encoder.word_starts(rows)
    for row, row_starts in zip(rows, starts):
        assert np.flatnonzero(row_starts).tolist() == _bpe_starts(encoder.bpe, row)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), wide=st.booleans())
def test_ids_equal_encode_batch_fast(encoder, fast_bl_wide, heldout_chunks, seed, wide):
    """FAST's own rows, random rows of tricky characters, and (wide) rows holding code points the encoder leaves to
    the library (at or above ``LIMIT``)."""
    rng = np.random.default_rng(seed)
    real = flatten(fast_bl_wide.coefficients(heldout_chunks[rng.integers(0, len(heldout_chunks), 20)]), "frequency")
    real = np.maximum(real - fast_bl_wide.min_token, 0)
    tricky = np.array(TRICKY)[rng.integers(0, len(TRICKY), real.shape)]
    rows = np.concatenate([real, tricky])
    if wide:
        rows[rng.integers(0, len(rows), 3), rng.integers(0, rows.shape[1], 3)] = rng.integers(LIMIT, 3 * LIMIT, 3)
    expected = [e.ids for e in encoder.bpe.encode_batch_fast(ints_to_strings(rows), add_special_tokens=False)]
    assert encoder.encode(rows) == expected


def test_fast_uses_it(fast_bl_tok):
    assert fast_bl_tok._byte_encoder is not None
