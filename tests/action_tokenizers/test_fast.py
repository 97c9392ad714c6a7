import warnings

import numpy as np
import pytest
import scipy.fft
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import action_tokenizers as at
from action_tokenizers import reference

from .conftest import D, T

chunk_in_box = arrays(np.float64, (T, D), elements=st.floats(-1, 1, allow_nan=False, width=64))


@settings(max_examples=60, deadline=None)
@given(chunk=chunk_in_box)
def test_error_within_dct_rounding_bound(fast_tok, chunk):
    before = fast_tok.encode_stats.clipped
    ids = fast_tok.encode(chunk)
    assert fast_tok.encode_stats.clipped == before  # the fit covers [-1, 1], so nothing is clipped
    out = fast_tok.decode(ids)
    assert out.valid.all()
    bound = 0.5 * np.sqrt(T * D) / fast_tok.scale
    assert np.linalg.norm(out.actions[0] - chunk) <= bound + 1e-9


@settings(max_examples=40, deadline=None)
@given(chunk=chunk_in_box)
def test_encode_decode_encode_is_identity_on_ids(fast_tok, fast_bl_tok, chunk):
    ids = fast_tok.encode(chunk)
    assert fast_tok.encode(fast_tok.decode(ids, mode="strict").actions) == ids
    # Byte-level can drop values never seen at fit time (counted, warned); where it did not, the same holds.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = fast_bl_tok.encode(chunk)
        out = fast_bl_tok.decode(ids)
        if out.valid.all():
            assert fast_bl_tok.encode(out.actions) == ids


def test_frequency_major_flatten(fast_tok):
    """The coefficient string is the [T, D] coefficient matrix in C order: frequency 0 of every dim first."""
    chunk = np.zeros((T, D))
    chunk[:, 3] = 0.5  # a constant in dim 3 -> only coefficient (frequency 0, dim 3) is non-zero
    ids = fast_tok.encode(chunk)[0]
    flat, offsets, lengths = fast_tok._token_symbols
    symbols = np.concatenate([flat[offsets[i] : offsets[i] + lengths[i]] for i in ids]) + fast_tok.min_token
    expected = np.zeros(T * D, dtype=int)
    expected[3] = round(0.5 * np.sqrt(T) * fast_tok.scale)
    np.testing.assert_array_equal(symbols, expected)


def test_byte_level_matches_reference_ids(train_chunks, heldout_chunks, fast_bl_tok):
    bpe, min_token = reference.fit(list(train_chunks), scale=10.0, vocab_size=512)
    assert min_token == fast_bl_tok.min_token
    want = reference.encode(bpe, heldout_chunks, 10.0, min_token)
    assert fast_bl_tok.encode(heldout_chunks) == want
    np.testing.assert_allclose(
        fast_bl_tok.decode(want).actions, reference.decode(bpe, want, 10.0, min_token, T, D), atol=1e-12
    )


def test_reference_through_transformers_wrapper_gives_same_ids(fast_bl_tok, heldout_chunks):
    """The published processor calls the BPE through transformers' PreTrainedTokenizerFast; that adds nothing."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=fast_bl_tok.bpe, clean_up_tokenization_spaces=False)
    q = fast_bl_tok.coefficients(heldout_chunks[:50])
    texts = ["".join(map(chr, np.maximum(row.flatten() - fast_bl_tok.min_token, 0))) for row in q]
    assert [wrapped(t)["input_ids"] for t in texts] == fast_bl_tok.encode(heldout_chunks[:50])


@pytest.mark.parametrize("subfolder", [False, True])
def test_loads_reference_files_in_both_layouts(tmp_path, train_chunks, heldout_chunks, subfolder):
    bpe, min_token = reference.fit(list(train_chunks[:1000]), scale=10.0, vocab_size=400)
    reference.save_layout(tmp_path, bpe, 10.0, 400, min_token, subfolder=subfolder)
    tok = at.load_tokenizer(tmp_path)
    assert isinstance(tok, at.FASTTokenizer) and tok.byte_level
    assert tok.encode(heldout_chunks) == reference.encode(bpe, heldout_chunks, 10.0, min_token)
    out = tok.decode(tok.encode(heldout_chunks), time_horizon=T, action_dim=D)
    assert out.valid.all()


def test_out_of_range_coefficients_are_clipped_and_counted(fast_tok):
    chunk = np.full((T, D), 4.0)  # far outside the fitted range
    before = fast_tok.encode_stats.clipped
    out = fast_tok.decode(fast_tok.encode(chunk))
    assert fast_tok.encode_stats.clipped > before
    assert out.valid.all() and np.all(out.actions < 4.0)


def test_byte_level_drop_is_counted_and_warned():
    """A value whose UTF-8 bytes never occurred at fit time is dropped by the byte-level BPE: never silently."""
    scale = 10.0
    coefs = np.zeros((200, T, D))
    coefs[:100, 0, 0] = 199  # symbols 0 and 199 only (two-byte UTF-8 above 127)
    chunks = scipy.fft.idct(coefs / scale, axis=1, norm="ortho")
    tok = at.FASTTokenizer.fit(chunks, scale=scale, vocab_size=512, byte_level=True)
    probe = np.zeros((1, T, D))
    probe[0, 0, 0] = 150  # code point 150 -> bytes C2 96; byte 96 is neither seen nor in the initial alphabet
    with pytest.warns(UserWarning, match="dropped"):
        ids = tok.encode(scipy.fft.idct(probe / scale, axis=1, norm="ortho"))
    assert tok.encode_stats.dropped >= 1
    assert not tok.decode(ids).valid[0]
    # The default character-level BPE keeps it.
    char = at.FASTTokenizer.fit(chunks, scale=scale, vocab_size=512)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = char.decode(char.encode(scipy.fft.idct(probe / scale, axis=1, norm="ortho")))
    assert out.valid[0]


def test_wrong_length_and_bad_ids_are_invalid_not_zero(fast_tok, heldout_chunks):
    ids = fast_tok.encode(heldout_chunks[:3])
    broken = [ids[0][:-1], ids[1] + [fast_tok.vocab_size + 5], ids[2]]
    out = fast_tok.decode(broken)
    assert out.valid.tolist() == [False, False, True]
    assert np.isnan(out.actions[0]).all() and "coefficients" in out.errors[0]
    assert "outside" in out.errors[1]
    with pytest.raises(at.DecodeError, match="chunk 0"):
        fast_tok.decode(broken, mode="strict")
    repaired = fast_tok.decode(broken, mode="repair")
    assert np.isfinite(repaired.actions).all() and repaired.valid.tolist() == [False, False, True]
    np.testing.assert_allclose(repaired.actions[1], fast_tok.decode([ids[1]]).actions[0])


def test_vocab_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match="raise vocab_size"):
        at.FASTTokenizer.fit(np.linspace(-30, 30, 700).reshape(10, 10, 7), vocab_size=64)


def test_fewer_tokens_than_binning_on_smooth_data(fast_tok, heldout_chunks):
    lengths = fast_tok.tokens_per_chunk(fast_tok.encode(heldout_chunks))
    assert lengths.mean() < T * D / 2
