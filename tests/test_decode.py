"""Decoding: the KV cache matches full recomputation (both the lean loop and transformers' own cached path), the
constraint makes every sampled chunk decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import D, T, fitted_tokenizers
from vla.model.decode import LeanSteps, VocabConstraint, generate, sample
from vla.model.prefix_lm import build_model
from vla.model.sequence import SequenceLayout, prefix_lm_mask
from vla.model.vocab import VocabMap

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
        cached = generate(model, prompt, use_cache=True, **kwargs)  # the lean loop (the default)
        full = generate(model, prompt, use_cache=False, **kwargs)
        hf = generate(model, prompt, use_cache=True, lean=False, **kwargs)  # transformers' cached forward
        assert torch.equal(cached.tokens, full.tokens), name
        assert torch.equal(hf.tokens, full.tokens), name
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
    gen = generate(
        model, prompt, vocab=vocab, constraint=constraint, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    out = gen.decode(tok, T, D)
    assert out.valid.all() and gen.valid.all(), [e for e in out.errors if e][:3]
    assert out.actions.shape == (n, T, D) and np.isfinite(out.actions).all()
    assert all(constraint.constraint.accepts(ids) for ids in gen.ids)
    # The same sampler without the constraint, on a smaller batch: the rate is reported, not asserted to be 0.
    m = 200
    free = generate(
        model,
        layout.build_prefix(["push"] * m, np.zeros((m, 2))),
        vocab=vocab,
        constraint=None,
        temperature=1.0,
        max_new_tokens=constraint.max_length + 1,
        generator=torch.Generator().manual_seed(0),
    )
    rate = free.decode(tok, T, D).valid.mean()
    with capsys.disabled():
        print(f"\n{name}: valid rate with the constraint 1.000 ({n} chunks), without it {rate:.3f} ({m} chunks)")
    assert rate < 0.5  # free sampling from random weights rarely ends in a decodable chunk
    assert all(e for e, v in zip(free.errors, free.valid) if not v)  # every invalid row says why


def test_stop_token_only_when_the_constraint_is_done():
    tok, vocab, model, layout = setup_for("fast")
    prompt = layout.build_prefix(["push"] * 50, np.zeros((50, 2)))
    gen = generate(
        model,
        prompt,
        vocab=vocab,
        constraint=tok.constraint(T, D),
        temperature=1.0,
        generator=torch.Generator().manual_seed(3),
    )
    for row, ids in zip(gen.tokens.tolist(), gen.ids):
        assert row[len(ids)] == vocab.end_id  # "|" right after the last action id, never earlier
        assert vocab.end_id not in row[: len(ids)]


def test_sampling_is_reproducible_and_top_p_narrows():
    tok, vocab, model, layout = setup_for("bin")
    prompt = layout.build_prefix(["push"] * 8, np.zeros((8, 2)))
    run = lambda seed, top_p=1.0: (  # noqa: E731
        generate(
            model,
            prompt,
            vocab=vocab,
            constraint=tok.constraint(T, D),
            temperature=1.0,
            top_p=top_p,
            generator=torch.Generator().manual_seed(seed),
        ).tokens
    )
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
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), num_beams=0)
    with pytest.raises(ValueError, match="needs temperature 0"):
        generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), num_beams=2, temperature=0.7)
    other = VocabMap.compact(tok.vocab_size + 1)
    with pytest.raises(ValueError, match="same tokenizer"):
        VocabConstraint(tok.constraint(T, D), other)


def test_unfinished_rows_are_invalid_and_say_why():
    tok, vocab, model, layout = setup_for("bin")
    gen = generate(
        model,
        layout.build_prefix(["push"] * 4, np.zeros((4, 2))),
        vocab=vocab,
        constraint=None,
        max_new_tokens=3,
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    out = gen.decode(tok, T, D)
    assert not out.valid.any() and np.isnan(out.actions).all()
    assert all(e is not None for e in out.errors)


# --- the lean decode loop ---------------------------------------------------------------------------------------------
def test_lean_path_serves_every_preset_and_steps_aside_for_training():
    tok = fitted_tokenizers()["fast"]
    vocab = VocabMap.compact(tok.vocab_size)
    model = build_model("micro", vocab, num_cameras=1, seed=0)
    assert LeanSteps.supports(model.eval())
    assert not LeanSteps.supports(model.train())  # dropout and friends are transformers' business
    assert LeanSteps.supports(build_model("tiny", vocab, num_cameras=0, seed=0).eval())


@pytest.mark.parametrize("state_encoding", ["text", "embedding"])
def test_lean_hidden_states_match_the_backbone(state_encoding):
    """The prefill's last hidden state and every step's, from LeanSteps, against the backbone's own forward."""
    tok = fitted_tokenizers()["fast"]
    vocab = VocabMap.compact(tok.vocab_size)
    embedding = state_encoding == "embedding"
    model = build_model(
        "micro", vocab, num_cameras=1, seed=1, state_dim=4 if embedding else None, state_tokens=1 if embedding else 0
    ).eval()
    layout = SequenceLayout(vocab, image_tokens=model.image_tokens, num_cameras=1, state_encoding=state_encoding)
    states = np.random.default_rng(0).uniform(-1, 1, (2, 4))
    prompt = layout.build_prefix(["push", "open the top drawer please"], states)
    images = torch.rand(2, 1, 3, 32, 32)
    n = 4
    with torch.inference_mode():
        lean = LeanSteps(model, prompt, n)
        got = lean.prefill(prompt, images)
        out = model(
            prompt.input_ids,
            prompt.attention_mask,
            prompt.position_ids,
            token_type_ids=prompt.ar,
            images=images,
            use_cache=True,
            state=prompt.state,
            state_slots=prompt.state_slots,
        )
        torch.testing.assert_close(got, out.last_hidden_state[:, -1], rtol=1e-5, atol=1e-5)
        cache, next_position = out.past_key_values, prompt.position_ids[:, -1] + 1
        ones = torch.ones(2, n, dtype=torch.bool)
        for step in range(n - 1):
            token = torch.tensor([vocab.action_to_vocab(np.int64(step)), vocab.action_to_vocab(np.int64(5 + step))])
            got = lean(token, step)
            key_valid = torch.cat([prompt.valid, ones[:, : step + 1]], dim=1)
            out = model(
                token[:, None],
                key_valid[:, None, :],
                (next_position + step)[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            torch.testing.assert_close(got, out.last_hidden_state[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["fast", "fsq"])
def test_lean_sampling_equals_transformers_path(name):
    """Temperature 1, one generator seed, a left-padded batch: the lean loop draws the very same ids."""
    tok, vocab, model, layout = setup_for(name, cameras=1, seed=2)
    tasks = ["push", "pick up the cube", "open the top drawer"] * 3  # different lengths: left padding
    prompt = layout.build_prefix(tasks, np.random.default_rng(2).uniform(-1, 1, (9, 4)))
    images = torch.rand(9, 1, 3, 32, 32)

    def run(**kw):
        return generate(
            model,
            prompt,
            vocab=vocab,
            constraint=tok.constraint(T, D),
            images=images,
            temperature=1.0,
            generator=torch.Generator().manual_seed(0),
            **kw,
        ).tokens

    assert torch.equal(run(), run(lean=False))
    assert torch.equal(run(), run(use_cache=False))


@pytest.mark.parametrize(("lean", "temperature"), [(True, 0.0), (False, 0.0), (True, 1.0)])
def test_nan_logits_make_a_chunk_invalid_never_valid(lean, temperature):
    """A diverged model (NaN weights): the constraint still makes well-formed ids, but every chunk is invalid; a
    sampled decode (a commit search samples at temperature 1) too, rather than an id the constraint refuses."""
    tok, vocab, model, layout = setup_for("fast")
    with torch.no_grad():
        model.backbone.lm_head.weight.fill_(float("nan"))
    prompt = layout.build_prefix(["push"] * 2, np.zeros((2, 2)))
    constraint = VocabConstraint(tok.constraint(T, D), vocab)
    gen = generate(model, prompt, vocab=vocab, constraint=constraint, lean=lean, temperature=temperature)
    assert not gen.valid.any() and all("NaN or inf" in e for e in gen.errors)
    assert not gen.decode(tok, T, D).valid.any()


# --- beam search ------------------------------------------------------------------------------------------------------
def _log_prob(model, prompt, vocab: VocabMap, constraint, ids: list[int]) -> float:
    """One row's ids (and the stop "|") scored in one forward pass over the whole sequence, under the constraint's
    masks: an independent reference for ``Generation.log_prob`` (which sums them step by step)."""
    vc = VocabConstraint(constraint, vocab)
    new = torch.as_tensor([[*vocab.action_to_vocab(np.asarray(ids, dtype=np.int64)).tolist(), vocab.end_id]])
    n, lp = new.shape[1], prompt.input_ids.shape[1]
    valid = torch.cat([prompt.valid, torch.ones(1, n, dtype=torch.bool)], dim=1)
    ar = torch.cat([prompt.ar, torch.ones_like(new)], dim=1)
    positions = torch.cat([prompt.position_ids, prompt.position_ids[:, -1:] + 1 + torch.arange(n)], dim=1)
    slots = torch.cat([prompt.state_slots, torch.zeros_like(new, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        out = model(
            torch.cat([prompt.input_ids, new], dim=1),
            prefix_lm_mask(valid, ar),
            positions,
            token_type_ids=ar,
            state=prompt.state,
            state_slots=slots,
        )
        logits = model.logits(out.last_hidden_state[0, lp - 1 : lp - 1 + n])  # [n, V]: the logits before each id
    total, state = 0.0, vc.start()
    for k, row in enumerate(logits):
        masked = row.masked_fill(~vc.mask(state), float("-inf"))
        total += float(torch.log_softmax(masked, dim=-1)[new[0, k]])
        if k < len(ids):
            state = constraint.advance(state, ids[k])
    return total


@pytest.mark.parametrize("name", ["fast", "bin"])
def test_beam_search_is_the_same_on_every_decoding_path(name):
    """The survivors' caches follow them: the lean loop, transformers' cache and full recomputation agree id for id."""
    tok, vocab, model, layout = setup_for(name, cameras=1)
    prompt = layout.build_prefix(["pick up the cube", "push"], np.random.default_rng(1).uniform(-1, 1, (2, 4)))
    kwargs = dict(vocab=vocab, constraint=tok.constraint(T, D), images=torch.rand(2, 1, 3, 32, 32), num_beams=3)
    lean = generate(model, prompt, **kwargs)
    hf = generate(model, prompt, lean=False, **kwargs)
    full = generate(model, prompt, use_cache=False, **kwargs)
    assert torch.equal(lean.tokens, hf.tokens) and torch.equal(lean.tokens, full.tokens)
    assert lean.valid.all() and tok.decode(lean.ids, time_horizon=T, action_dim=D).valid.all()


@pytest.mark.parametrize("name", ["fast", "bin", "fsq"])
def test_beam_search_is_at_least_as_probable_as_greedy(name):
    tok, vocab, model, layout = setup_for(name, seed=3)
    prompt = layout.build_prefix(["push", "open the drawer", "reach"], np.random.default_rng(2).uniform(-1, 1, (3, 2)))
    constraint = tok.constraint(T, D)
    greedy = generate(model, prompt, vocab=vocab, constraint=constraint)
    for k in (2, 4):
        beam = generate(model, prompt, vocab=vocab, constraint=constraint, num_beams=k)
        assert beam.valid.all()
        assert (beam.log_prob >= greedy.log_prob - 1e-4).all(), (k, beam.log_prob, greedy.log_prob)
        for r in range(3):  # the reported score is the chunk's, as one forward pass over it scores it
            row = layout.build_prefix([["push", "open the drawer", "reach"][r]], prompt.state[r : r + 1].numpy())
            assert beam.log_prob[r] == pytest.approx(_log_prob(model, row, vocab, constraint, beam.ids[r]), abs=1e-3)
    for r in range(3):
        row = layout.build_prefix([["push", "open the drawer", "reach"][r]], prompt.state[r : r + 1].numpy())
        assert greedy.log_prob[r] == pytest.approx(_log_prob(model, row, vocab, constraint, greedy.ids[r]), abs=1e-3)


def test_beam_search_with_room_for_every_hypothesis_finds_the_most_probable_chunk():
    """3 bins, 3 ids per chunk: 27 chunks. With 9 beams nothing is pruned before the last id, so the answer is the
    most probable of all 27 (scored one by one), where greedy's id-by-id choice need not be."""
    import itertools

    import action_tokenizers as at

    tok = at.BinningTokenizer.fit(np.zeros((1, 1, 3)), n_bins=3)
    vocab = VocabMap.compact(tok.vocab_size)
    constraint = tok.constraint(1, 3)
    found_better = False
    for seed in (3, 4, 5):  # seed 4's and 5's greedy chunks are not the most probable (seed 3's is)
        model = build_model("micro", vocab, seed=seed).eval()
        prompt = SequenceLayout(vocab).build_prefix(["push"], np.random.default_rng(seed).uniform(-1, 1, (1, 2)))
        chunks = itertools.product(range(3), repeat=3)
        scores = {ids: _log_prob(model, prompt, vocab, constraint, list(ids)) for ids in chunks}
        best = max(scores, key=scores.get)
        beam = generate(model, prompt, vocab=vocab, constraint=constraint, num_beams=9)
        greedy = generate(model, prompt, vocab=vocab, constraint=constraint)
        assert tuple(beam.ids[0]) == best and beam.log_prob[0] == pytest.approx(scores[best], abs=1e-4)
        found_better |= scores[tuple(greedy.ids[0])] < scores[best] - 1e-4
    assert found_better, "greedy found the most probable chunk for every seed: the test does not tell beam search apart"


@pytest.mark.parametrize("decoder", [{}, {"lean": False}, {"use_cache": False}, {"num_beams": 3}])
def test_forced_prefix_begins_each_chunk_and_the_rest_is_decoded_after_it(decoder):
    """Committed-prefix decoding: each row's chunk begins with its forced ids (the committed actions' bins) and the
    rest is decoded after them, valid; greedy gives the same ids on every decoding path."""
    tok, vocab, model, layout = setup_for("bin", cameras=1)
    prompt = layout.build_prefix(["pick up the cube", "push"], np.random.default_rng(4).uniform(-1, 1, (2, 4)))
    images = torch.rand(2, 1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    committed = np.random.default_rng(5).uniform(-1, 1, (2, 3, D))  # three steps of each chunk already run
    forced = tok.prefix_ids(committed)
    assert [len(row) for row in forced] == [3 * D, 3 * D]
    kwargs = dict(vocab=vocab, constraint=tok.constraint(T, D), images=images, **decoder)
    free, gen = generate(model, prompt, **kwargs), generate(model, prompt, forced=forced, **kwargs)
    assert gen.valid.all() and [row[: 3 * D] for row in gen.ids] == forced
    if "num_beams" not in decoder:
        assert (
            gen.ids
            == generate(model, prompt, forced=forced, vocab=vocab, constraint=kwargs["constraint"], images=images).ids
        )
    assert [row[: 3 * D] for row in free.ids] != forced  # the model alone would not have written them
    chunks = tok.decode(gen.ids, time_horizon=T, action_dim=D).actions
    np.testing.assert_allclose(chunks[:, :3], committed, atol=1 / tok.n_bins + 1e-9)  # within half a bin
    partial = generate(model, prompt, forced=[forced[0][:2], []], **kwargs)  # rows may force different lengths
    assert partial.ids[0][:2] == forced[0][:2] and partial.valid.all()
    with pytest.raises(ValueError, match="forced id 9999 is not an action id"):
        generate(model, prompt, forced=[[9999], []], **kwargs)
    with pytest.raises(ValueError, match="ids mix the chunk's steps"):
        fitted_tokenizers()["fast"].prefix_ids(committed)
