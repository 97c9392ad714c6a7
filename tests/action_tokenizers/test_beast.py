"""BEAST: ids in range, fixed length, an error bound inside the spline space, and encode(decode(ids)) == ids."""

import action_tokenizers as at
import numpy as np
import pytest
from action_tokenizers.beast import bspline_basis
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

shapes = st.tuples(st.integers(2, 40), st.integers(1, 6), st.integers(1, 12), st.integers(0, 4))  # T, D, N, p


def _tok(t, d, n, p, n_bins=256, bound=1.0):
    n = min(n, t)
    p = min(p, n - 1)
    return at.BEASTTokenizer(time_horizon=t, action_dim=d, n_control_points=n, degree=p, n_bins=n_bins, bound=bound)


def test_basis_is_a_partition_of_unity_and_clamped():
    basis = bspline_basis(50, 10, 4)
    assert basis.shape == (50, 10) and (basis >= 0).all()
    np.testing.assert_allclose(basis.sum(axis=1), 1.0, atol=1e-12)
    assert basis[0, 0] == pytest.approx(1.0) and basis[-1, -1] == pytest.approx(1.0)  # ends at the end points


@settings(max_examples=50, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**32 - 1), n_bins=st.integers(2, 1024), bound=st.floats(0.5, 3.0))
def test_ids_in_range_fixed_length_and_bound_in_the_spline_space(shape, seed, n_bins, bound):
    tok = _tok(*shape, n_bins=n_bins, bound=bound)
    d, n = tok.action_dim, tok.n_control_points
    rng = np.random.default_rng(seed)
    control = rng.uniform(-1, 1, (4, n, d)) * tok.bound
    chunks = np.einsum("tn,bnd->btd", tok.basis, control)  # exactly representable by the spline
    ids = tok.encode(chunks)
    assert all(len(row) == n * d for row in ids)
    assert all(0 <= i < n_bins for row in ids for i in row)
    out = tok.decode(ids)
    assert out.valid.all()
    bias = np.abs(tok.encoder @ tok.basis - np.eye(n)).sum(axis=1).max()  # the ridge's pull on the control points
    assert np.abs(out.actions - chunks).max() <= tok.bound / n_bins + bias * tok.bound + 1e-9


@settings(max_examples=50, deadline=None)
@given(shape=shapes, data=st.data())
def test_encode_decode_encode_is_identity_on_ids(shape, data):
    tok = _tok(*shape)
    k = tok.n_control_points * tok.action_dim
    ids = data.draw(st.lists(st.integers(0, tok.n_bins - 1), min_size=k, max_size=k))
    out = tok.decode([ids], mode="strict")
    assert tok.encode(out.actions) == [ids]


@settings(max_examples=30, deadline=None)
@given(chunk=arrays(np.float64, (10, 7), elements=st.floats(-1, 1, allow_nan=False, width=64)))
def test_any_chunk_decodes_smoothly(beast_tok, chunk):
    out = beast_tok.decode(beast_tok.encode(chunk))
    assert out.valid.all() and np.isfinite(out.actions).all() and np.abs(out.actions).max() <= beast_tok.bound


def test_fit_sets_the_bound_from_the_control_points(train_chunks):
    tok = at.BEASTTokenizer.fit(train_chunks, n_control_points=6, degree=3)
    cp = np.abs(tok.control_points(train_chunks))
    assert tok.bound >= 1.0 and np.mean(cp > tok.bound) <= 0.001 + 1e-9
    assert at.BEASTTokenizer.fit(train_chunks, bound=1.0).bound == 1.0  # the paper's range


def test_order_is_control_point_major():
    tok = at.BEASTTokenizer(time_horizon=8, action_dim=2, n_control_points=3, degree=1, n_bins=4, bound=1.0)
    control = np.array([[-0.75, 0.75], [-0.25, 0.25], [0.25, -0.25]])  # bin centres of 4 bins: -.75 -.25 .25 .75
    ids = tok.encode(tok.basis @ control)
    assert ids == [[0, 3, 1, 2, 2, 1]]


def test_smooth_data_error_and_compression(beast_tok, heldout_chunks):
    ids = beast_tok.encode(heldout_chunks)
    out = beast_tok.decode(ids)
    assert len(ids[0]) == 6 * 7
    assert np.sqrt(np.mean((out.actions - heldout_chunks) ** 2)) < 0.05  # smooth chunks are nearly in the space


def test_bad_options_and_shapes(beast_tok):
    with pytest.raises(ValueError, match="degree 4 needs more than 4 control points"):
        at.BEASTTokenizer.fit(np.zeros((3, 10, 2)), n_control_points=4, degree=4)
    with pytest.raises(ValueError, match="n_control_points 12 is more than time_horizon 10"):
        at.BEASTTokenizer.fit(np.zeros((3, 10, 2)), n_control_points=12)
    with pytest.raises(ValueError, match="n_bins"):
        at.BEASTTokenizer.fit(np.zeros((3, 10, 2)), n_bins=1)
    with pytest.raises(ValueError, match="time_horizon 12 but this tokenizer was fitted for time_horizon 10"):
        beast_tok.encode(np.zeros((12, 7)))
    with pytest.raises(ValueError, match="spells chunks of"):
        beast_tok.decode([[0] * 42], time_horizon=12)
    out = beast_tok.decode([[0] * 41, [0] * 41 + [256]])
    assert not out.valid.any() and "41 ids" in out.errors[0] and "outside" in out.errors[1]
