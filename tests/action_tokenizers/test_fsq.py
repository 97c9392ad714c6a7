import action_tokenizers as at
import numpy as np
import pytest
from action_tokenizers.synthetic import smooth_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import D, T


def test_fixed_number_of_tokens(fsq_tok, heldout_chunks):
    ids = fsq_tok.encode(heldout_chunks)
    assert {len(r) for r in ids} == {5}  # ceil(10 / 2)
    assert fsq_tok.vocab_size == 8 * 5 * 5 * 5


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.integers(0, 999), min_size=5, max_size=5))
def test_codes_indices_invariant(fsq_tok, ids):
    assert fsq_tok.codes_roundtrip_ok(np.array([ids]))
    out = fsq_tok.decode([ids])
    assert out.valid.all() and np.isfinite(out.actions).all()
    again = fsq_tok.encode(out.actions)[0]  # decoded chunks encode again to K in-range ids
    assert len(again) == 5 and all(0 <= i < fsq_tok.vocab_size for i in again)


def test_reconstruction_beats_half_the_std_on_held_out_chunks():
    """A small, briefly trained model already halves the error of predicting the mean on smooth 3-D chunks
    (the default options on 20k [10, 7] chunks are measured by scripts/bench_tokenizers.py)."""
    train, held = smooth_chunks(3000, T, 3, seed=0), smooth_chunks(300, T, 3, seed=1)
    tok = at.FSQTokenizer.fit(train, hidden=32, depth=1, steps=200, lr=3e-3, show_progress=False)
    out = tok.decode(tok.encode(held))
    assert np.sqrt(np.mean((out.actions - held) ** 2)) <= 0.5 * held.std()


def test_fit_is_seeded(train_chunks):
    kw = dict(hidden=16, depth=0, steps=20, show_progress=False)
    a = at.FSQTokenizer.fit(train_chunks[:500], seed=3, **kw)
    b = at.FSQTokenizer.fit(train_chunks[:500], seed=3, **kw)
    assert a.encode(train_chunks[:50]) == b.encode(train_chunks[:50])


def test_shape_must_match_the_fit(fsq_tok):
    with pytest.raises(ValueError, match="time_horizon 12"):
        fsq_tok.encode(np.zeros((12, D)))
    with pytest.raises(ValueError, match="action_dim 3"):
        fsq_tok.encode(np.zeros((T, 3)))
    # the constraint promises every sequence it accepts decodes to the shape asked: only the fitted one
    for shape in ({"time_horizon": T + 2}, {"action_dim": D + 1}):
        with pytest.raises(ValueError, match=rf"spells chunks of \[{T}, {D}\].*fit one for that shape"):
            fsq_tok.constraint(**shape)
        with pytest.raises(ValueError, match=rf"spells chunks of \[{T}, {D}\]"):
            fsq_tok.decode([[0] * fsq_tok.model.tokens], **shape)
    assert fsq_tok.constraint(T, D).max_length == fsq_tok.model.tokens


def test_bad_options():
    with pytest.raises(ValueError, match="levels"):
        at.FSQTokenizer.fit(np.zeros((4, T, D)), levels=[1, 5])
    with pytest.raises(ValueError, match="downsample"):
        at.FSQTokenizer.fit(np.zeros((4, T, D)), downsample=20)
    with pytest.raises(ValueError, match="max_seconds"):
        at.FSQTokenizer.fit(np.zeros((4, T, D)), max_seconds=0)


def test_time_budget_stops_the_fit_and_keeps_the_best_weights(train_chunks):
    """A tiny budget stops long before ``steps``; the report says so and what the kept weights reached."""
    kw = dict(hidden=16, depth=0, steps=100_000, show_progress=False)
    tok = at.FSQTokenizer.fit(train_chunks[:1000], max_seconds=0.5, **kw)
    report = tok.fit_report
    assert report["stopped"] == "time" and report["steps"] < 100_000 and report["seconds"] < 30
    assert np.isfinite(report["heldout_mse"])
    out = tok.decode(tok.encode(train_chunks[:50]))
    assert out.valid.all()
