import action_tokenizers as at
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays


@settings(max_examples=60, deadline=None)
@given(
    n_bins=st.integers(2, 1024),
    chunk=arrays(np.float64, (4, 3), elements=st.floats(-1, 1, allow_nan=False, width=64)),
)
def test_error_at_most_half_a_bin(n_bins, chunk):
    tok = at.BinningTokenizer(n_bins=n_bins, time_horizon=4, action_dim=3)
    ids = tok.encode(chunk)
    assert len(ids[0]) == 12 and all(0 <= i < n_bins for i in ids[0])
    out = tok.decode(ids)
    assert np.abs(out.actions[0] - chunk).max() <= 1.0 / n_bins + 1e-12
    assert tok.encode(out.actions) == ids


def test_clipping_is_counted():
    tok = at.BinningTokenizer(n_bins=16, time_horizon=2, action_dim=2)
    out = tok.decode(tok.encode(np.array([[1.5, 0.0], [-3.0, 1.0]])))
    assert tok.encode_stats.clipped == 2
    np.testing.assert_allclose(out.actions[0, :, 0], [1 - 1 / 16, -1 + 1 / 16])


def test_time_major_layout():
    tok = at.BinningTokenizer(n_bins=2, time_horizon=2, action_dim=2)
    assert tok.encode(np.array([[-0.5, 0.5], [0.5, -0.5]])) == [[0, 1, 1, 0]]


def test_binning_is_built_without_data_as_fit_builds_it_and_the_others_refuse():
    chunks = np.random.default_rng(0).uniform(-1, 1, (50, 10, 3))
    fitted = at.BinningTokenizer.fit(chunks, n_bins=64)
    built = at.BinningTokenizer.unfitted(10, 3, n_bins=64)
    assert (built.vocab_size, built.time_horizon, built.action_dim) == (64, 10, 3)
    assert built.encode(chunks) == fitted.encode(chunks)
    assert not at.BinningTokenizer.learns_from_data
    for name in ("fast", "beast", "fsq"):
        cls = at.get_tokenizer_class(name)
        assert cls.learns_from_data
        with pytest.raises(ValueError, match="learns from action chunks"):
            cls.unfitted(10, 3)
