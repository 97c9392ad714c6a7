import json
import warnings

import action_tokenizers as at
import numpy as np
import pytest
import scipy.fft
from action_tokenizers import rate, reference
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

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
    bound = (0.5 + fast_tok.deadzone) * np.sqrt(T * D) / fast_tok.scale
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


@pytest.mark.parametrize("order, position", [("frequency", 3), ("dimension", 3 * T)])
def test_coefficient_order(train_chunks, order, position):
    """Frequency-major: the [T, D] coefficients in C order (frequency 0 of every dim first, the reference).
    Dimension-major (the default): dim 0's frequencies 0..T-1, then dim 1's, ..."""
    tok = at.FASTTokenizer.fit(train_chunks[:500], vocab_size=256, order=order)
    chunk = np.zeros((T, D))
    chunk[:, 3] = 0.5  # a constant in dim 3 -> only coefficient (frequency 0, dim 3) is non-zero
    ids = tok.encode(chunk)[0]
    flat, offsets, lengths = tok._token_symbols
    symbols = np.concatenate([flat[offsets[i] : offsets[i] + lengths[i]] for i in ids]) + tok.min_token
    expected = np.zeros(T * D, dtype=int)
    expected[position] = round(0.5 * np.sqrt(T) * tok.scale)
    np.testing.assert_array_equal(symbols, expected)
    np.testing.assert_allclose(tok.decode([ids]).actions[0], chunk, atol=0.5 / tok.scale)


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
    # the alphabet, read off the vocabulary, is the fitted coefficients' span: the constraint allows no wider values
    span = np.concatenate([c.flatten() for c in reference_coefficients(train_chunks[:1000])])
    assert int(span.max() - span.min()) + 1 <= tok.n_symbols <= int(span.max() - span.min()) + 3


def reference_coefficients(chunks) -> list[np.ndarray]:
    return [np.around(scipy.fft.dct(np.asarray(c, float), axis=0, norm="ortho") * 10.0) for c in chunks]


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


def test_byte_level_matches_reference_on_values_never_seen_at_fit(train_chunks):
    """Values above the fitted range pass through as their code points, as in the reference (not clipped)."""
    small = train_chunks[:1000] * 0.3  # a narrow fit: the probe's coefficients reach far beyond its range
    tok = at.FASTTokenizer.fit(small, scale=10.0, vocab_size=512, byte_level=True)
    bpe, min_token = reference.fit(list(small), scale=10.0, vocab_size=512)
    probe = np.concatenate([train_chunks[-200:], 2.0 * train_chunks[-50:]])
    want = reference.encode(bpe, probe, 10.0, min_token)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tok.encode(probe) == want
    got, ref = tok.decode(want), reference.decode(bpe, want, 10.0, min_token, T, D)
    np.testing.assert_allclose(got.actions[got.valid], ref[got.valid], atol=1e-12)


def test_vocab_size_none_grows_with_the_coefficient_range(train_chunks):
    assert at.FASTTokenizer.fit(train_chunks[:300], vocab_size=None).vocab_size <= 1024
    wide = at.FASTTokenizer.fit(
        train_chunks[:300], scale=200.0, vocab_size=None
    )  # ~1300 symbols: 2**ceil(log2(1300 + 256))
    q = wide.n_symbols
    assert wide.vocab_size <= max(1024, 2 ** int(np.ceil(np.log2(q + 256)))) and wide.vocab_size >= q
    assert wide.vocab_size > 1024


def test_target_rmse_picks_the_scale(train_chunks, heldout_chunks):
    tok = at.FASTTokenizer.fit(train_chunks, target_rmse=0.02)
    out = tok.decode(tok.encode(train_chunks))
    rmse = np.sqrt(np.mean((out.actions - train_chunks) ** 2))
    assert 0.017 <= rmse <= 0.02
    with pytest.raises(ValueError, match="target_rmse"):
        at.FASTTokenizer.fit(train_chunks[:10], target_rmse=-1.0)


@pytest.mark.parametrize("cls", [at.FASTTokenizer, at.BinningTokenizer])
def test_wrong_time_horizon_is_refused(train_chunks, cls):
    tok = cls.fit(train_chunks[:300])
    with pytest.raises(ValueError, match=f"time_horizon 12 but this tokenizer was fitted for time_horizon {T}"):
        tok.encode(np.zeros((12, D)))


def test_files_without_order_load_as_the_reference_layout(train_chunks, tmp_path):
    """Tokenizers saved before ``order``/``deadzone`` existed were frequency-major with plain rounding."""
    tok = at.FASTTokenizer.fit(train_chunks[:500], vocab_size=256, order="frequency", deadzone=0.0)
    path = tok.save_pretrained(tmp_path / "tok") / "action_tokenizer.json"
    config = json.loads(path.read_text())
    del config["order"], config["deadzone"]
    path.write_text(json.dumps(config))
    loaded = at.load_tokenizer(tmp_path / "tok")
    assert (loaded.order, loaded.deadzone) == ("frequency", 0.0)
    assert loaded.encode(train_chunks[:20]) == tok.encode(train_chunks[:20])


def test_bad_fit_options(train_chunks):
    with pytest.raises(ValueError, match="order"):
        at.FASTTokenizer.fit(train_chunks[:50], order="time")
    with pytest.raises(ValueError, match="deadzone"):
        at.FASTTokenizer.fit(train_chunks[:50], deadzone=0.5)
    with pytest.raises(ValueError, match="scale"):
        at.FASTTokenizer.fit(train_chunks[:50], scale=0)


def test_byte_level_row_stays_valid_before_a_row_that_starts_mid_character(fast_bl_wide, heldout_chunks):
    """A character never runs on into the next row: a well-formed row is valid whatever follows it."""
    dec = fast_bl_wide._byte_decoder
    continuation = int(np.flatnonzero((dec.lengths > 0) & ((dec.flat[dec.offsets] & 0xC0) == 0x80))[0])
    real = fast_bl_wide.encode(heldout_chunks[:100])
    split = next(r for r in real if not dec.whole[r].all())  # a row whose bytes need the general UTF-8 path
    out = fast_bl_wide.decode([split, [continuation], split])
    assert out.valid.tolist() == [True, False, True]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), wide=st.booleans())
def test_byte_level_decode_equals_the_bpe_decoder(fast_bl_tok, fast_bl_wide, heldout_chunks, seed, wide):
    """The numpy UTF-8 path gives what the BPE's own decoder gives, on real, corrupted and random ids."""
    fast_bl_tok = fast_bl_wide if wide else fast_bl_tok
    rng = np.random.default_rng(seed)
    real = fast_bl_tok.encode(heldout_chunks[rng.integers(0, len(heldout_chunks), 4)])
    corrupted = [r[: rng.integers(0, len(r) + 1)] + rng.integers(0, fast_bl_tok.vocab_size, 2).tolist() for r in real]
    noise = [rng.integers(0, fast_bl_tok.vocab_size, rng.integers(0, 30)).tolist() for _ in range(4)]
    rows = real + corrupted + noise
    out = fast_bl_tok.decode(rows, mode="repair")
    for row, actions, ok in zip(rows, out.actions, out.valid):
        text = fast_bl_tok.bpe.decode(row, skip_special_tokens=False)
        assert ok == ("\ufffd" not in text and len(text) == T * D)
        if ok:
            q = np.array([ord(c) for c in text]).reshape(T, D) + fast_bl_tok.min_token
            np.testing.assert_allclose(actions, scipy.fft.idct(q / fast_bl_tok.scale, axis=0, norm="ortho"), atol=1e-12)


def test_auto_vocabulary_grows_with_the_data_and_says_why(train_chunks):
    few = at.FASTTokenizer.fit(train_chunks[:200])
    many = at.FASTTokenizer.fit(np.concatenate([train_chunks] * 8))  # the same chunks, each id seen 8x as often
    assert few.vocab_size in rate.VOCAB_CANDIDATES and many.vocab_size in rate.VOCAB_CANDIDATES
    assert few.vocab_size < many.vocab_size
    assert (
        few.fit_choices["vocab_size"][0] == few.vocab_size and "smallest vocabulary" in few.fit_choices["vocab_size"][1]
    )
    least = rate.min_median_id_count(train_chunks.shape[1])
    assert f"at least {least} times" in many.fit_choices["vocab_size"][1]
    assert many.encode_stats.chunks == 0  # the choice's own encodes are not counted as the caller's
    counts = rate.id_counts(many.encode(np.concatenate([train_chunks] * 8)), many.vocab_size)
    assert np.median(counts[counts > 0]) >= least  # what the reason claims holds
    explicit = at.FASTTokenizer.fit(train_chunks[:200], vocab_size=512)
    assert explicit.vocab_size == 512 and explicit.fit_choices == {}  # an explicit value wins
    published = at.FASTTokenizer.fit(train_chunks[:200], byte_level=True)
    assert published.vocab_size == at.FASTTokenizer.fit(train_chunks[:200], byte_level=True, vocab_size=None).vocab_size
    with pytest.raises(ValueError, match="vocab_size must be an integer, 'auto' or None"):
        at.FASTTokenizer.fit(train_chunks[:200], vocab_size="big")


def test_what_the_fit_chose_is_said_saved_and_loaded_back(train_chunks, tmp_path):
    tok = at.FASTTokenizer.fit(train_chunks[:200])
    lines = tok.choices()
    assert [line.split(" = ")[0] for line in lines] == list(tok.fit_choices)  # alphabet, then vocab_size
    assert f"vocab_size = {tok.vocab_size}: " in "\n".join(lines)
    back = at.load_tokenizer(tok.save_pretrained(tmp_path / "tok"))
    assert back.fit_choices == tok.fit_choices and back.choices() == lines
    config = json.loads((tmp_path / "tok" / at.base.CONFIG_NAME).read_text())
    assert config["fit_choices"]["vocab_size"]["value"] == tok.vocab_size
    config["fit_choices"] = {"vocab_size": 128}  # not {value, why}
    (tmp_path / "tok" / at.base.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="fit_choices must map at most 16 setting names"):
        at.load_tokenizer(tmp_path / "tok")
    assert at.FASTTokenizer.fit(train_chunks[:200], vocab_size=512).choices() == []


def test_auto_alphabet_clips_a_few_outlying_chunks_and_counts_them(train_chunks):
    chunks = train_chunks.copy()
    chunks[:2] *= 40  # two chunks far outside the normalised range
    full = at.FASTTokenizer.fit(chunks, vocab_size=None)
    auto = at.FASTTokenizer.fit(chunks)
    assert auto.n_symbols * 3 < full.n_symbols  # the alphabet is not widened for two chunks
    value, why = auto.fit_choices["alphabet"]
    assert value == f"{auto.min_token}..{auto.min_token + auto.n_symbols - 1}" and "clipped when encoded" in why
    ids = auto.encode(chunks[:10])
    assert auto.encode_stats.clipped > 0  # the outliers are clipped, and counted
    decoded = auto.decode(ids, time_horizon=chunks.shape[1], action_dim=chunks.shape[2])
    err = np.linalg.norm((decoded.actions - chunks[:10]).reshape(10, -1), axis=1)
    bound = (0.5 + auto.deadzone) * np.sqrt(chunks.shape[1] * chunks.shape[2]) / auto.scale
    assert (err[2:] <= bound + 1e-9).all() and (err[:2] > bound).all()  # only the outliers lose precision
    clean = at.FASTTokenizer.fit(train_chunks)
    assert clean.fit_choices["alphabet"][1] == "the coefficients' full range"


def test_the_vocabulary_rule_takes_the_largest_whose_typical_id_is_common_for_the_chunk_length():
    seen = []

    def spell(size):  # a typical id seen 4000 / size * 100 times: 128 -> 3125, 256 -> 1562, 512 -> 781, 1024 -> 390
        seen.append(size)
        return np.full(size, 400_000 // size)

    size, why = rate.choose_vocab_size(65, 10_000, 10, spell)  # T = 10: at least 500 times
    assert size == 512 and seen == [128, 256, 512, 1024]  # stops at the first too rare
    assert "at least 500 times (50 per step of the 10-step chunks)" in why and "781 times; 1024 ids: 390 times" in why
    seen.clear()
    size, why = rate.choose_vocab_size(65, 10_000, 50, spell)  # T = 50: every frame counted in 50 chunks, 2,500
    assert size == 128 and seen == [128, 256] and "3125 times; 256 ids: 1562 times" in why
    size, why = rate.choose_vocab_size(200, 100, 10, lambda v: np.full(v, 3))
    assert size == 256 and "smallest vocabulary that holds the 200-symbol alphabet" in why
    seen.clear()
    size, why = rate.choose_vocab_size(65, 10_000, 10, lambda v: seen.append(v) or np.full(min(v, 300), 4000))
    assert size == 512 and seen == [128, 256, 512]  # the merges ran out at 300 ids: a larger one builds the same
    assert "every pair seen twice merged: 300 ids" in why


def test_auto_records_the_vocabulary_it_built():
    """Data with few distinct pairs runs out of merges below the rule's size: the size recorded and said is the one
    built, not the candidate asked for."""
    for chunks in (np.zeros((300, 4, 2)), np.random.default_rng(1).uniform(-1, 1, (400, 1, 1))):
        tok = at.FASTTokenizer.fit(chunks, vocab_size="auto")
        size, why = tok.fit_choices["vocab_size"]
        assert size == tok.vocab_size < 128 and f"{tok.vocab_size} ids" in why
