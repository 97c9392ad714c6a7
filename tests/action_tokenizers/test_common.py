"""Properties every tokenizer shares: id range, save/load, constraints, and clear errors on bad input."""

import dataclasses
import json
import warnings

import action_tokenizers as at
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import D, T


def test_ids_in_range_and_valid(tok, heldout_chunks):
    ids = tok.encode(heldout_chunks)
    flat = np.concatenate([np.asarray(r) for r in ids])
    assert flat.min() >= 0 and flat.max() < tok.vocab_size
    out = tok.decode(ids, time_horizon=T, action_dim=D)
    assert out.actions.shape == (len(heldout_chunks), T, D) and out.valid.all()


@pytest.mark.parametrize("extra", [-1, "vocab_size"])
def test_an_out_of_range_id_invalidates_its_row(tok, heldout_chunks, extra):
    """Even where the row's other ids spell a whole chunk (FAST marked such a row valid, dropping the id)."""
    ids = tok.encode(heldout_chunks[:3])
    bad = tok.vocab_size if extra == "vocab_size" else extra
    for row in ([*ids[0], bad], [bad, *ids[0]]):
        out = tok.decode([row, ids[1], ids[2]], time_horizon=T, action_dim=D)
        assert out.valid.tolist() == [False, True, True]
        assert f"id {bad} is outside" in out.errors[0] and np.isnan(out.actions[0]).all()
        repaired = tok.decode([row], time_horizon=T, action_dim=D, mode="repair")
        assert not repaired.valid[0] and np.isfinite(repaired.actions).all()


def test_single_chunk_and_batch_agree(tok, heldout_chunks):
    assert tok.encode(heldout_chunks[0]) == tok.encode(heldout_chunks[:1])


def test_save_load_gives_identical_ids(tok, heldout_chunks, tmp_path):
    tok.save_pretrained(tmp_path / "tok")
    loaded = at.load_tokenizer(tmp_path / "tok")
    assert type(loaded) is type(tok)
    ids = tok.encode(heldout_chunks)
    assert loaded.encode(heldout_chunks) == ids
    np.testing.assert_array_equal(loaded.decode(ids).actions, tok.decode(ids).actions)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_walks_over_the_constraint_always_decode(all_toks, seed):
    rng = np.random.default_rng(seed)
    for tok in all_toks.values():
        c = tok.constraint(time_horizon=T, action_dim=D)
        state, ids = c.start(), []
        while not c.done(state):
            mask = c.allowed(state)
            assert mask.shape == (tok.vocab_size,) and mask.any(), "dead end"
            choice = int(rng.choice(np.flatnonzero(mask)))
            ids.append(choice)
            state = c.advance(state, choice)
            assert len(ids) <= c.max_length
        assert not c.allowed(state).any()
        assert tok.decode([ids], mode="strict").actions.shape == (1, T, D)
        assert c.accepts(ids)


def test_constraint_rejects_disallowed_ids(fast_tok):
    c = fast_tok.constraint()
    state = c.start()
    longest = int(np.argmax(c.lengths))
    assert c.lengths[longest] > 1  # the fixture's BPE has merges, so some id spells several coefficients
    for _ in range(T * D - 1):
        state = c.advance(state, int(np.flatnonzero(c.lengths == 1)[0]))
    with pytest.raises(ValueError, match="not allowed"):
        c.advance(state, longest)  # one coefficient left: an id of several cannot fit


def test_unconstrained_random_ids_are_often_invalid(fast_tok):
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, fast_tok.vocab_size, rng.integers(1, 40)).tolist() for _ in range(200)]
    assert fast_tok.decode(rows).valid.mean() < 0.5


# --- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, message",
    [
        (np.full((T, D), np.nan), "NaN or inf"),
        (np.zeros((2, 2, T, D)), "shape"),
        (np.zeros((0, T, D)), "empty batch"),
        (np.zeros((T, D + 1)), "action_dim"),
        ("not numbers", "numeric"),
    ],
)
def test_bad_chunks(tok, bad, message):
    with pytest.raises(ValueError, match=message):
        tok.encode(bad)


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_complex_chunks_are_refused_naming_the_dtype(tok, heldout_chunks, dtype):
    """The cast to float would drop the imaginary part with only numpy's warning: refused, nothing encoded."""
    before = dataclasses.replace(tok.encode_stats)
    chunks = (heldout_chunks[:2] + 0.5j).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's ComplexWarning would be an error here: none is raised
        with pytest.raises(ValueError) as err:
            tok.encode(chunks)
    assert str(err.value).startswith(f"chunks are complex ({np.dtype(dtype)}); tokenizers take real actions")
    assert "\n" not in str(err.value) and tok.encode_stats == before
    with pytest.raises(ValueError, match=r"complex \(complex128\)"):
        tok.encode([[complex(1, 1)] * D] * T)  # a nested list of Python complex numbers too


def test_bad_ids(tok):
    with pytest.raises(ValueError, match="empty batch"):
        tok.decode([])
    with pytest.raises(ValueError, match="batch"):
        tok.decode([1, 2, 3])
    with pytest.raises(ValueError, match="integers"):
        tok.decode([[0.5, 1.0]])
    with pytest.raises(ValueError, match="decode mode"):
        tok.decode([[0]], mode="lenient")
    out = tok.decode([[tok.vocab_size]])
    assert not out.valid[0] and "outside" in out.errors[0]


def test_unknown_name_suggests_close_one():
    with pytest.raises(ValueError, match="did you mean 'fast'"):
        at.get_tokenizer_class("fats")


@pytest.mark.parametrize("damage", ["missing_config", "corrupt_config", "wrong_version", "missing_weights"])
def test_corrupt_or_missing_files(tok, tmp_path, damage):
    path = tok.save_pretrained(tmp_path / "tok")
    config = path / "action_tokenizer.json"
    if damage == "missing_config":
        config.unlink()
    elif damage == "corrupt_config":
        config.write_text("{not json")
    elif damage == "wrong_version":
        config.write_text(json.dumps({**json.loads(config.read_text()), "format_version": 99}))
    else:
        extra = [p for p in path.iterdir() if p.name != "action_tokenizer.json"]
        if extra:
            extra[0].write_bytes(b"\x00garbage")
        else:  # binning and BEAST are described by their JSON alone: damage that instead
            config.write_text(json.dumps({"type": tok.name, "format_version": 1}))
    with pytest.raises(ValueError, match=r"missing|corrupt|format_version|lacks"):
        at.load_tokenizer(path)


def test_missing_directory():
    with pytest.raises(ValueError, match="no tokenizer directory"):
        at.load_tokenizer("/nonexistent/tok")


def test_save_is_atomic(fast_tok, tmp_path, monkeypatch):
    """A save that fails half-way leaves the previous save intact and no temporary directory."""
    target = fast_tok.save_pretrained(tmp_path / "tok")
    before = (target / "action_tokenizer.json").read_text()

    def boom(directory):
        (directory / "partial").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fast_tok, "_save_files", boom)
    with pytest.raises(RuntimeError):
        fast_tok.save_pretrained(target)
    assert (target / "action_tokenizer.json").read_text() == before and not (target / "partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]
