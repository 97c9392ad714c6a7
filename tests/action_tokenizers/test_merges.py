"""Byte-level encoding through ``Merges`` (the whole batch merged stage by stage) gives exactly the ids of Hugging
Face's BPE model: on FAST's rows (clipped, dropped and wide values included), on words of a vocabulary trained so that
its merges overlap in long chains, and, for the overlap rule alone, against the model's order written out per pair."""

import warnings

import numpy as np
import pytest
from action_tokenizers.byte_level import LIMIT, ByteLevelEncoder
from action_tokenizers.coefficients import flatten, ints_to_strings
from action_tokenizers.merges import Merges, _first_of_overlaps
from action_tokenizers.reference import bpe_trainer
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenizers import ByteLevelBPETokenizer, Tokenizer, models


def _library_ids(bpe, rows: np.ndarray) -> list[list[int]]:
    return [e.ids for e in bpe.encode_batch_fast(ints_to_strings(rows), add_special_tokens=False)]


def _greedy(rank: list[int]) -> list[bool]:
    """The model's order spelled out: the pair of lowest (rank, position) that no merged pair took an id from goes
    next, and takes its ids from its neighbours."""
    merged, taken = [False] * len(rank), [False] * len(rank)
    for k in sorted(range(len(rank)), key=lambda k: (rank[k], k)):
        if not taken[k]:
            merged[k] = True
            for j in (k - 1, k + 1):
                if 0 <= j < len(rank):
                    taken[j] = True
    return merged


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=6))
def test_first_of_overlaps_is_the_models_order(chains):
    """Chains of overlapping pairs side by side (pairs in different chains never overlap)."""
    rank = np.array([r for chain in chains for r in chain], dtype=np.int16)
    overlap = np.ones(len(rank) - 1, dtype=bool)
    overlap[np.cumsum([len(c) for c in chains])[:-1] - 1] = False
    want = [m for chain in chains for m in _greedy(chain)]
    assert _first_of_overlaps(rank, overlap).tolist() == want


@pytest.fixture(scope="module")
def chained():
    """A byte-level BPE trained on words of three letters, so that its merges chain and overlap in many ways."""
    rng = np.random.default_rng(0)
    letters = np.array([ord(c) for c in "abc"])
    texts = ints_to_strings(letters[rng.integers(0, 3, (400, 30))])
    bpe = ByteLevelBPETokenizer()._tokenizer
    bpe.train_from_iterator(texts, trainer=bpe_trainer(300, 0, False))
    return bpe


@pytest.mark.parametrize("seed", range(3))
def test_chained_vocabulary_equals_the_library(chained, seed):
    encoder = ByteLevelEncoder(chained)
    assert encoder.merges is not None and len(encoder.merges.stage_ranks) > 1
    rng = np.random.default_rng(seed)
    rows = np.array([ord(c) for c in "abc d"])[rng.integers(0, 5, (300, 40))]
    rows[:50] = ord("a")  # long runs of one letter: chains of one pair
    assert encoder.encode(rows) == _library_ids(chained, rows)


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
def test_fast_rows_equal_the_library_and_the_words_path(fast_bl_tok, fast_bl_wide, heldout_chunks, scale):
    """Chunks of the narrow and the wide fit, scaled so that many clip (below the fitted range) or leave it (above,
    up to code points the encoder leaves to the library)."""
    rng = np.random.default_rng(int(scale))
    for tok in (fast_bl_tok, fast_bl_wide):
        chunks = heldout_chunks * rng.uniform(0.5, scale, (len(heldout_chunks), 1, 1))
        rows = np.maximum(flatten(tok.coefficients(chunks), "frequency") - tok.min_token, 0)
        assert rows.max() < 0xD800  # no surrogates: the rows are what encode spells
        want = _library_ids(tok.bpe, rows)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dropped values are counted and warned about elsewhere
            assert tok.encode(chunks) == want
        encoder = tok._byte_encoder
        assert encoder.merges is not None
        narrow = (rows < LIMIT).all(axis=1)
        assert encoder._encode_words(rows[narrow]) == [w for w, ok in zip(want, narrow) if ok]


def test_drops_edges_and_unsupported_models(chained, fast_bl_wide):
    """Bytes the vocabulary lacks are dropped like the model drops them (whole words and rows can vanish); one-symbol
    rows; and a model with options ``Merges`` does not reproduce (dropout) is left to the model."""
    encoder = ByteLevelEncoder(chained)
    a, d, e_acute = ord("a"), ord("d"), 0xE9  # d and both bytes of e-acute were never seen: dropped
    rows = np.array([[d, a, a, d, a], [d, d, 32, d, d], [e_acute, a, e_acute, a, a], [a, 32, a, 39, 115]])
    assert encoder.encode(rows) == _library_ids(chained, rows)
    assert encoder.encode(rows[:, :1]) == _library_ids(chained, rows[:, :1]) == [[], [], [], [chained.token_to_id("a")]]
    noisy = Tokenizer.from_str(fast_bl_wide.bpe.to_str())
    noisy.model.dropout = 0.5
    assert Merges.from_bpe(noisy) is None
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}
    assert Merges.from_bpe(Tokenizer(models.BPE(vocab, [("a", "b"), ("ab", "c")]))) is not None
    assert Merges.from_bpe(Tokenizer(models.BPE(vocab, [("ab", "c"), ("a", "b")]))) is None  # uses a later merge's id
