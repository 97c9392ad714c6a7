"""The vectorised longest-match segmentation equals a plain per-row loop, and spells what it was given."""

import numpy as np
from action_tokenizers.longest_match import Trie
from hypothesis import given, settings
from hypothesis import strategies as st


def longest_match_loop(vocab: dict[tuple[int, ...], int], row: list[int]) -> list[int]:
    """The readable version: at each position take the longest vocabulary entry that starts there."""
    longest = max(map(len, vocab))
    ids, pos = [], 0
    while pos < len(row):
        for k in range(min(longest, len(row) - pos), 0, -1):
            if tuple(row[pos : pos + k]) in vocab:
                ids.append(vocab[tuple(row[pos : pos + k])])
                pos += k
                break
    return ids


def _tables(fast_tok):
    flat, offsets, lengths = fast_tok._token_symbols
    vocab = {}
    for tid in np.argsort(lengths, kind="stable"):
        vocab.setdefault(tuple(flat[offsets[tid] : offsets[tid] + lengths[tid]].tolist()), int(tid))
    return vocab, Trie.build(flat, offsets, lengths, fast_tok.n_symbols)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 80))
def test_vectorised_equals_the_loop(fast_tok, heldout_chunks, seed, width):
    vocab, trie = _tables(fast_tok)
    rng = np.random.default_rng(seed)
    real = (
        np.clip(
            fast_tok.coefficients(heldout_chunks[rng.integers(0, len(heldout_chunks), 5)]) - fast_tok.min_token,
            0,
            fast_tok.n_symbols - 1,
        )
        .transpose(0, 2, 1)
        .reshape(5, -1)[:, :width]
    )
    noise = rng.integers(0, fast_tok.n_symbols, (3, width))
    rows = np.concatenate([real if real.shape[1] == width else np.zeros((0, width), int), noise])
    ids, counts = trie.segment(rows)
    got = np.split(ids, np.cumsum(counts)[:-1])
    for row, row_ids in zip(rows, got):
        assert row_ids.tolist() == longest_match_loop(vocab, row.tolist())
        flat, offsets, lengths = fast_tok._token_symbols
        spelled = np.concatenate([flat[offsets[i] : offsets[i] + lengths[i]] for i in row_ids])
        np.testing.assert_array_equal(spelled, row)


def test_fewer_ids_than_replaying_the_merges(fast_tok, heldout_chunks):
    from action_tokenizers.coefficients import flatten, ints_to_strings

    symbols = np.clip(
        flatten(fast_tok.coefficients(heldout_chunks) - fast_tok.min_token, fast_tok.order), 0, fast_tok.n_symbols - 1
    )
    merges = np.mean([len(e.ids) for e in fast_tok.bpe.encode_batch_fast(ints_to_strings(symbols))])
    assert np.mean([len(r) for r in fast_tok.encode(heldout_chunks)]) <= merges
