"""Decoding: the KV cache matches full recomputation, the constraint makes every sampled chunk decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_sequence import D, T, fitted_tokenizers
from vla.decode import VocabConstraint, generate, sample
from vla.model import build_model
from vla.sequence import SequenceLayout, VocabMap

TOKENIZERS = ["fast", "fast_byte_level", "bin", "fsq"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def setup_for(name: str, cameras: int = 0, seed: int = 0):
    tok = fitted_tokenizers()[name]
    vocab = VocabMap.compact(tok.vocab_size)
    model = build_model("micro", vocab, num_cameras=cameras, seed=seed).eval()
    layout = SequenceLayout(vocab, image_tokens=model.image_tokens, num_cameras=cameras)
    return tok, vocab, model, layout


@pytest.mark.parametrize("name", TOKENIZERS)
def test_kv_cache_greedy_equals_full_recomputation(name):
    tok, vocab, model, layout = setup_for(name, cameras=1)
    rng = np.random.default_rng(0)
    prompt = layout.build_prefix(["pick up the cube", "push", "open the top drawer"], rng.uniform(-1, 1, (3, 4)))
    images = torch.rand(3, 1, 3, 32, 32)
    for constraint in (tok.constraint(T, D), None):
        kwargs = dict(vocab=vocab, constraint=constraint, images=images, max_new_tokens=12)
        if constraint is not None:
            kwargs.pop("max_new_tokens")
        cached = generate(model, prompt, use_cache=True, **kwargs)
        full = generate(model, prompt, use_cache=False, **kwargs)
        assert torch.equal(cached.tokens, full.tokens), name
        assert cached.ids == full.ids


def test_kv_cache_equals_recomputation_with_a_state_encoder():
    tok = fitted_tokenizers()["fast"]
    vocab = VocabMap.compact(tok.vocab_size)
    model = build_model("micro", vocab, num_cameras=0, seed=0, state_dim=4, state_tokens=1).eval()
    layout = SequenceLayout(vocab, state_encoding="embedding")
    prompt = layout.build_prefix(["push", "pick up the cube"], np.random.default_rng(0).uniform(-1, 1, (2, 4)))
    kwargs = dict(vocab=vocab, constraint=tok.constraint(T, D))
    cached, full = generate(model, prompt, use_cache=True, **kwargs), generate(model, prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.tokens, full.tokens)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_1000_sampled_chunks_all_decode_with_the_constraint(name, capsys):
    """Random weights, temperature 1: with the constraint every chunk is valid; without it, few are (reported)."""
    tok, vocab, model, layout = setup_for(name)
    n = 1000
    prompt = layout.build_prefix(["push"] * n, np.random.default_rng(1).uniform(-1, 1, (n, 2)))
    constraint = VocabConstraint(tok.constraint(T, D), vocab)
    gen = generate(model, prompt, vocab=vocab, constraint=constraint, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    out = gen.decode(tok, T, D)
    assert out.valid.all() and gen.valid.all(), [e for e in out.errors if e][:3]
    assert out.actions.shape == (n, T, D) and np.isfinite(out.actions).all()
    assert all(constraint.constraint.accepts(ids) for ids in gen.ids)
    # The same sampler without the constraint, on a smaller batch: the rate is reported, not asserted to be 0.
    m = 200
    free = generate(model, layout.build_prefix(["push"] * m, np.zeros((m, 2))), vocab=vocab, constraint=None,
                    temperature=1.0, max_new_tokens=constraint.max_length + 1,
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    rate = free.decode(tok, T, D).valid.mean()
    with capsys.disabled():
        print(f"\n{name}: valid rate with the constraint 1.000 ({n} chunks), without it {rate:.3f} ({m} chunks)")
    assert 0.0 <= rate <= 1.0
    assert all(e for e, v in zip(free.errors, free.valid) if not v)  # every invalid row says why


def test_stop_token_only_when_the_constraint_is_done():
    tok, vocab, model, layout = setup_for("fast")
    prompt = layout.build_prefix(["push"] * 50, np.zeros((50, 2)))
    gen = generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), temperature=1.0,
                   generator=torch.Generator().manual_seed(3))  # fmt: skip
    for row, ids in zip(gen.tokens.tolist(), gen.ids):
        assert row[len(ids)] == vocab.end_id  # "|" right after the last action id, never earlier
        assert vocab.end_id not in row[: len(ids)]


def test_sampling_is_reproducible_and_top_p_narrows():
    tok, vocab, model, layout = setup_for("bin")
    prompt = layout.build_prefix(["push"] * 8, np.zeros((8, 2)))
    run = lambda seed, top_p=1.0: generate(  # noqa: E731
        model, prompt, vocab=vocab, constraint=tok.constraint(T, D), temperature=1.0, top_p=top_p,
        generator=torch.Generator().manual_seed(seed),
    ).tokens  # fmt: skip
    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))
    greedy = generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D)).tokens
    assert torch.equal(run(0, top_p=1e-6), greedy)  # a tiny nucleus keeps only the top id


def test_sample_respects_masks():
    logits = torch.tensor([[0.0, 5.0, float("-inf"), 1.0]] * 2000)
    ids = sample(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert (ids != 2).all() and set(ids.tolist()) == {0, 1, 3}
    assert sample(logits[:1], 0.0, 1.0, None).item() == 1
    counts = torch.bincount(ids, minlength=4).float() / len(ids)
    expected = torch.softmax(logits[0], 0)
    assert torch.allclose(counts, expected, atol=0.03)


def test_budget_and_option_errors():
    tok, vocab, model, layout = setup_for("bin")
    prompt = layout.build_prefix(["push"], np.zeros((1, 2)))
    with pytest.raises(ValueError, match="can cut constrained chunks"):
        generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), max_new_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens is required"):
        generate(model, prompt, vocab=vocab, constraint=None)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), top_p=0.0)
    other = VocabMap.compact(tok.vocab_size + 1)
    with pytest.raises(ValueError, match="same tokenizer"):
        VocabConstraint(tok.constraint(T, D), other)


def test_unfinished_rows_are_invalid_and_say_why():
    tok, vocab, model, layout = setup_for("bin")
    gen = generate(model, layout.build_prefix(["push"] * 4, np.zeros((4, 2))), vocab=vocab, constraint=None,
                   max_new_tokens=3, temperature=1.0, generator=torch.Generator().manual_seed(0))  # fmt: skip
    out = gen.decode(tok, T, D)
    assert not out.valid.any() and np.isnan(out.actions).all()
    assert all(e is not None for e in out.errors)
