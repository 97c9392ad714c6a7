"""Huge, tiny and subnormal finite values: clipped to the extreme code and counted, never wrapped into a wrong value
that decodes as valid (a float -> int64 cast of 1e19 gives -2**63, and 1e17 * scale * sqrt(T) overflows after the
DCT). Every test here runs with warnings as errors: numpy's "invalid value encountered in cast" is the symptom."""

import warnings

import action_tokenizers as at
import numpy as np
import pytest
from action_tokenizers.fsq import VALUE_LIMIT
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import D, T

MAX = np.finfo(np.float64).max
HUGE = 1e6  # beyond every tokenizer's range here (FAST's value_limit is ~13 char-level, ~4e5 byte-level)
huge = st.one_of(
    st.sampled_from([HUGE, 1e17, 1e19, 1e30, 1e300, MAX]), st.floats(min_value=HUGE, max_value=MAX)
).flatmap(lambda v: st.sampled_from([v, -v]))
inside = st.one_of(  # within [-1, 1], which every fixture's fit covers: nothing is clipped
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -2.2250738585072014e-308, 1.0, -1.0]),
    st.floats(-1.0, 1.0),
)
column_values = st.lists(st.one_of(huge, inside), min_size=D, max_size=D)

pytestmark = pytest.mark.filterwarnings("error")
NAMES = ["fast", "fast_byte_level", "bin", "fsq", "beast"]


def _encode_decode(tok, chunk):
    """encode + decode, allowing only byte-level FAST's (counted) drop warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="byte-level FAST dropped", category=UserWarning)
        ids = tok.encode(chunk)
        return ids, tok.decode(ids, time_horizon=T, action_dim=D)


def _range(tok) -> float:
    """The largest |value| a valid decode can hold."""
    if isinstance(tok, at.FASTTokenizer):
        top = max(abs(tok.min_token), abs(tok.min_token + tok.top_symbol))
        return np.sqrt(T * D) * top / tok.scale  # ||x||_2 = ||coef||_2 for the orthonormal DCT
    if isinstance(tok, at.BEASTTokenizer):
        return tok.bound  # a convex combination of bin centres (the basis rows are >= 0 and sum to 1)
    if isinstance(tok, at.BinningTokenizer):
        return 1.0
    return np.inf  # FSQ: a learned decoder, finite but without a stated range


def _clipped_per_huge_dim(tok) -> int:
    if isinstance(tok, at.FASTTokenizer):
        return 1  # a constant dimension has only a DC coefficient
    if isinstance(tok, at.BEASTTokenizer):
        return tok.n_control_points  # the spline through a constant: every control point at that value
    return T  # binning and FSQ clip values


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(values=column_values)
def test_constant_dims_clip_to_the_extreme_of_their_sign(all_toks, name, values):
    """Each dimension constant over time: huge ones decode at the edge of the range with their sign, exactly as
    HUGE does; the others come back within the tokenizer's error; each huge dimension is counted."""
    tok = all_toks[name]
    values = np.array(values)
    chunk = np.broadcast_to(values, (T, D)).copy()
    is_huge = np.abs(values) >= HUGE
    before = tok.encode_stats.__dict__.copy()
    ids, out = _encode_decode(tok, chunk)
    stats = tok.encode_stats
    assert all(0 <= i < tok.vocab_size for i in ids[0])
    assert stats.chunks == before["chunks"] + 1
    assert stats.clipped - before["clipped"] == _clipped_per_huge_dim(tok) * int(is_huge.sum())
    saturated = np.where(is_huge, np.sign(values) * HUGE, values)
    assert ids == _encode_decode(tok, np.broadcast_to(saturated, (T, D)).copy())[0]
    if stats.dropped > before["dropped"]:  # byte-level: a value above the fitted range that the BPE cannot spell
        assert not out.valid[0] and np.isnan(out.actions).all()
        return
    assert out.valid[0] and np.isfinite(out.actions).all()
    x = out.actions[0]
    assert np.abs(x).max() <= _range(tok) + 1e-9
    if isinstance(tok, at.FSQTokenizer):
        return  # learned: no sign or error guarantee
    assert (np.sign(x[:, is_huge]) == np.sign(values[is_huge])).all()
    err = np.abs(x[:, ~is_huge] - values[~is_huge])
    if isinstance(tok, at.FASTTokenizer):
        bound = (0.5 + tok.deadzone) * np.sqrt(T) / tok.scale  # per dimension: the DCT runs per dimension
        assert (np.linalg.norm(err, axis=0) <= bound + 1e-9).all()
    elif isinstance(tok, at.BinningTokenizer):
        assert (err <= 1.0 / tok.n_bins + 1e-12).all()
    else:
        assert (err <= tok.bound / tok.n_bins + 1e-4).all()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(
    cells=st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, D - 1), huge), min_size=1, max_size=12),
    base=st.floats(-0.5, 0.5),
)
def test_huge_values_anywhere_are_counted_and_never_wrap(all_toks, name, cells, base):
    """Huge values at random places: no warning, ids in range, a finite decode within the range, and at least the
    coefficients the values reach counted (binning, FSQ: exactly the values beyond the range)."""
    tok = all_toks[name]
    chunk = np.full((T, D), base)
    for t, d, v in cells:
        chunk[t, d] = v
    is_huge = np.abs(chunk) >= HUGE
    before = tok.encode_stats.__dict__.copy()
    ids, out = _encode_decode(tok, chunk)
    clipped = tok.encode_stats.clipped - before["clipped"]
    assert all(0 <= i < tok.vocab_size for i in ids[0])
    if isinstance(tok, (at.BinningTokenizer, at.FSQTokenizer)):
        assert clipped == int(is_huge.sum())
    else:  # every dimension holding a huge value has a coefficient / control point beyond the range
        assert clipped >= int(is_huge.any(axis=0).sum())
    if tok.encode_stats.dropped > before["dropped"]:
        assert not out.valid[0]
        return
    assert out.valid[0] and np.isfinite(out.actions).all()
    assert np.abs(out.actions).max() <= _range(tok) + 1e-9
    if isinstance(tok, at.BinningTokenizer):
        assert (np.sign(out.actions[0][is_huge]) == np.sign(chunk[is_huge])).all()


@pytest.mark.parametrize("value", [1e17, 1e19, 1e30, 1e300, MAX])
def test_saved_fast_decodes_a_huge_chunk_as_its_extreme(fast_tok, tmp_path, value):
    """The reported fault: a FAST tokenizer loaded from disk decoded a chunk of 1e17 as -2.79 and 1e19 or 1e30 as
    -1.01, marked valid, after a RuntimeWarning from the cast. Now it is the largest value of its sign, counted."""
    tok = at.load_tokenizer(fast_tok.save_pretrained(tmp_path / "fast"))
    top = tok.decode(tok.encode(np.full((T, D), HUGE))).actions
    bottom = tok.decode(tok.encode(np.full((T, D), -HUGE))).actions
    for sign, extreme in ((1, top), (-1, bottom)):
        out = tok.decode(tok.encode(np.full((T, D), sign * value)))
        assert out.valid[0]
        np.testing.assert_array_equal(out.actions, extreme)
        assert (np.sign(out.actions) == sign).all()
    assert tok.encode_stats.clipped == 4 * D  # one DC coefficient per dimension, four chunks
    assert (top > 0.5).all() and (bottom < -0.5).all()  # the fitted range covers [-1, 1]


def test_fsq_clips_values_beyond_its_limit(fsq_tok):
    chunk = np.zeros((T, D))
    chunk[0, 0], chunk[1, 1] = 1e39, -1e300  # float32 makes 1e39 inf
    before = fsq_tok.encode_stats.clipped
    clipped = chunk.copy()
    clipped[0, 0], clipped[1, 1] = VALUE_LIMIT, -VALUE_LIMIT
    assert fsq_tok.encode(chunk) == fsq_tok.encode(clipped)
    assert fsq_tok.encode_stats.clipped == before + 2


def test_fit_on_overflowing_chunks_is_a_clear_error():
    chunks = np.zeros((20, T, D))
    chunks[:, ::2, 0], chunks[:, 1::2, 0] = MAX, -MAX
    with pytest.raises(ValueError, match="overflow.*normalised"):
        at.FASTTokenizer.fit(chunks)
    chunks[:, :, 0] = 1e17
    with pytest.raises(ValueError, match="span .* values.*lower scale.*normalised"):
        at.FASTTokenizer.fit(chunks)
    with pytest.raises(ValueError, match="raise vocab_size"):
        at.FASTTokenizer.fit(chunks / 1e15, vocab_size=1024)


def test_float_ids_beyond_int64_are_invalid_not_wrapped(bin_tok, fast_tok):
    for tok in (bin_tok, fast_tok):
        out = tok.decode([[1e30] * T * D, [-1e300] * T * D], time_horizon=T, action_dim=D)
        assert not out.valid.any() and all("outside" in e for e in out.errors)


@pytest.mark.parametrize("name", NAMES)
def test_a_dimension_at_the_float_limit_leaves_the_others_ids_alone(all_toks, name):
    """A value at the float limit in one dimension encodes as if it were merely huge: the other dimensions' ids,
    a tiny value on a bin edge among them, are what they would be anyway (BEAST once scaled the whole chunk down)."""
    tok = all_toks[name]
    values = np.array([0.0, 0.0, -2.220446049250313e-16, HUGE, HUGE, HUGE, np.finfo(np.float64).max])
    saturated = np.where(np.abs(values) >= HUGE, np.sign(values) * HUGE, values)
    assert (
        _encode_decode(tok, np.broadcast_to(values, (T, D)).copy())[0]
        == (_encode_decode(tok, np.broadcast_to(saturated, (T, D)).copy())[0])
    )
