"""One-pass (parallel) decoding: the slot layout and its mask, the loss on the slots only, a decode that is always
valid, the lean path, save/load, and the clear error for variable-length tokenizers (FAST)."""

from __future__ import annotations

import functools

import action_tokenizers as at
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from action_tokenizers.synthetic import smooth_chunks

from tests.conftest import D, T, assert_plot, fitted_tokenizers
from tests.test_policy import make_batch, make_policy, normalizers
from vla.model.decode import fixed_chunk_length, generate
from vla.model.sequence import SequenceLayout
from vla.model.vocab import VocabMap
from vla.policy import VLAConfig, VLAPolicy
from vla.policy.pipeline import SEQUENCE, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.cache
def beast() -> at.ActionTokenizer:
    return at.BEASTTokenizer.fit(smooth_chunks(200, T, D, seed=0), n_control_points=5, degree=3)


def tokenizer(name: str) -> at.ActionTokenizer:
    return beast() if name == "beast" else fitted_tokenizers()[name]


def parallel_policy(name: str, **overrides) -> VLAPolicy:
    if name != "beast":
        return make_policy(name, decoding="parallel", **overrides)
    action_norm, state_norm = normalizers()
    config = VLAConfig(
        preset="micro", time_horizon=T, n_action_steps=4, device="cpu", init_seed=0, decoding="parallel", **overrides
    )
    policy = VLAPolicy(config, action_tokenizer=beast(), action_normalizer=action_norm, state_normalizer=state_norm)
    return policy.eval()


def layout(n: int = 6, attention: str = "prefix_lm") -> SequenceLayout:
    return SequenceLayout(VocabMap.compact(16), decoding="parallel", num_slots=n, attention=attention)


# --- what is fixed-length ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bin", "fsq", "beast", "fast", "fast_byte_level"])
def test_fixed_chunk_length_is_read_from_the_constraint(name):
    tok = tokenizer(name)
    n = fixed_chunk_length(tok.constraint(T, D))
    if name.startswith("fast"):
        assert n is None
        return
    ids = tok.encode(smooth_chunks(5, T, D, seed=3))
    assert n == len(ids[0]) and all(len(row) == n for row in ids)


@pytest.mark.parametrize("name", ["fast", "fast_byte_level"])
def test_parallel_with_a_variable_length_tokenizer_is_a_clear_error(name):
    with pytest.raises(ValueError, match="fixed number of ids per chunk.*decoding='autoregressive'"):
        make_policy(name, decoding="parallel")


@pytest.mark.parametrize(
    ("name", "chosen"), [("bin", "parallel"), ("fsq", "autoregressive"), ("fast", "autoregressive")]
)
def test_auto_decoding_is_chosen_by_the_tokenizer(name, chosen):
    """``decoding="auto"`` (what `vla train` starts from without a config file, and LeRobot's path may give): one pass
    for binning, whose ids each spell one value, one id at a time for the others; the policy built accordingly."""
    policy = make_policy(name, decoding="auto")
    assert policy.config.decoding == chosen
    assert (policy.model.slot_embedding is not None) == (chosen == "parallel")


def test_beam_search_waits_for_autos_choice():
    """``num_beams > 1`` with ``decoding="auto"`` is allowed until the tokenizer chooses: kept where it chooses one id
    at a time, refused where it chooses one pass, naming both ways out."""
    assert make_policy("fast", decoding="auto", num_beams=4).config.num_beams == 4
    with pytest.raises(ValueError, match="use num_beams=1, or temperature=0 and decoding='autoregressive'"):
        make_policy("bin", decoding="auto", num_beams=4)


def test_an_unknown_decoding_is_refused():
    with pytest.raises(ValueError, match="VLAConfig.decoding = 'beam' is invalid: use one of autoregressive, parallel"):
        VLAConfig(decoding="beam", device="cpu")
    with pytest.raises(ValueError, match="num_slots >= 1"):
        SequenceLayout(VocabMap.compact(16), decoding="parallel")


# --- layout and mask -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", ["prefix_lm", "causal"])
def test_slots_see_the_prefix_and_each_other_and_the_prefix_never_sees_them(attention):
    lay = layout(attention=attention)
    states = np.zeros((2, 3))
    seq = lay.build_training_sequence(["push", "pick up the cube"], states, [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])
    mask = seq.attention_mask
    for r in range(2):
        slots, valid = seq.query_slots[r], seq.valid[r]
        prefix = valid & ~slots
        assert int(slots.sum()) == 6 and int(prefix.sum()) == int(seq.prefix_len[r])
        assert not mask[r][prefix][:, slots].any()  # the prefix never sees a slot
        assert mask[r][slots][:, valid].all()  # each slot sees the whole prefix and every slot
        assert not mask[r][:, ~valid].any() and not mask[r][~valid].any()  # padding sees and is seen by nothing
        pm = mask[r][prefix][:, prefix]
        if attention == "prefix_lm":
            assert pm.all()  # bidirectional prefix
        else:
            assert torch.equal(pm, torch.ones_like(pm).tril())  # a GPT's prefix
        positions = seq.position_ids[r][slots]
        assert positions.tolist() == list(range(int(seq.prefix_len[r]), int(seq.prefix_len[r]) + 6))


def test_loss_and_accuracy_are_on_the_action_slots_only():
    lay = layout(n=4)
    rows = [[0, 15, 7, 7], [3, 2, 1, 0]]
    seq = lay.build_training_sequence(["push", "open the drawer"], np.zeros((2, 3)), rows)
    assert torch.equal(seq.loss_mask, seq.query_slots) and torch.equal(seq.action_mask, seq.query_slots)
    assert (seq.targets[~seq.query_slots] == lay.vocab.text.pad_id).all()
    assert seq.targets[seq.query_slots].view(2, 4).tolist() == lay.vocab.action_to_vocab(np.array(rows)).tolist()
    with pytest.raises(ValueError, match="not fixed-length"):
        lay.build_training_sequence(["push"], np.zeros((1, 3)), [[1, 2, 3]])
    prompt = lay.build_prefix(["push", "open the drawer"], np.zeros((2, 3)))
    assert prompt.query_slots[:, -4:].all() and int(prompt.query_slots.sum()) == 8  # left-padded: slots last
    assert not prompt.loss_mask.any()


def test_the_policy_loss_is_cross_entropy_at_every_slot_at_once():
    policy = parallel_policy("bin")
    packed = run(policy.pipeline.training, make_batch(3))
    seq = packed[SEQUENCE]
    n = fixed_chunk_length(policy.action_tokenizer.constraint(T, D))
    loss, metrics = policy.model.loss(seq)
    assert float(metrics["suffix_tokens"]) == 3 * n
    out = policy.model(
        seq.input_ids,
        seq.attention_mask,
        seq.position_ids,
        token_type_ids=seq.ar,
        state=seq.state,
        state_slots=seq.state_slots,
        query_slots=seq.query_slots,
    )
    logits = policy.model.logits(out.last_hidden_state[seq.query_slots])  # [3 n, V]
    expected = torch.as_tensor(policy.vocab.action_to_vocab(np.concatenate(packed["action_ids"])))
    assert torch.allclose(loss, F.cross_entropy(logits, expected))


def test_the_prefix_is_blind_to_the_slot_embeddings():
    policy = parallel_policy("fsq")
    seq = run(policy.pipeline.prompt, make_batch(2))[SEQUENCE]

    def hidden():
        return policy.model(
            seq.input_ids,
            seq.attention_mask,
            seq.position_ids,
            token_type_ids=seq.ar,
            state=seq.state,
            state_slots=seq.state_slots,
            query_slots=seq.query_slots,
        ).last_hidden_state

    with torch.no_grad():
        before = hidden()
        policy.model.slot_embedding.weight.add_(torch.randn_like(policy.model.slot_embedding.weight))
        after = hidden()
    prefix = seq.valid & ~seq.query_slots
    assert torch.equal(before[prefix], after[prefix])
    assert not torch.allclose(before[seq.query_slots], after[seq.query_slots])


# --- decoding ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bin", "fsq", "beast"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_pass_decoding_of_an_untrained_model_is_always_a_valid_chunk(name, temperature):
    policy = parallel_policy(name, temperature=temperature)
    n = fixed_chunk_length(policy.action_tokenizer.constraint(T, D))
    chunks = policy.predict_action_chunk(make_batch(4), generator=torch.Generator().manual_seed(0))
    info = policy.last_decode_info
    assert chunks.shape == (4, T, D) and torch.isfinite(chunks).all()
    assert info.valid.all() and info.steps == 1 and (info.tokens_per_chunk == n).all()


def test_the_constraint_holds_even_when_the_model_prefers_other_ids(monkeypatch):
    policy = parallel_policy("bin")
    logits = policy.model.logits

    def text_loving(hidden):  # the largest logit is always a text id (the "|" stop)
        out = logits(hidden)
        out[..., policy.vocab.end_id] = 1e4
        return out

    monkeypatch.setattr(policy.model, "logits", text_loving)
    policy.predict_action_chunk(make_batch(3))
    assert policy.last_decode_info.valid.all()
    prompt = run(policy.pipeline.prompt, make_batch(3))[SEQUENCE]
    free = generate(policy.model, prompt, vocab=policy.vocab, constraint=None)  # unconstrained: invalid, and said
    assert not free.valid.any() and "non-action id" in free.errors[0]


@pytest.mark.parametrize("name", ["bin", "fsq"])
def test_the_lean_pass_equals_transformers_forward(name):
    policy = parallel_policy(name)
    prompt = run(policy.pipeline.prompt, make_batch(3))[SEQUENCE]
    a, b = (
        generate(policy.model, prompt, vocab=policy.vocab, constraint=policy.constraint, lean=lean)
        for lean in (True, False)
    )
    assert a.ids == b.ids and a.valid.all() and a.steps == b.steps == 1


def test_a_few_steps_teach_the_slots_their_ids():
    policy = parallel_policy("fsq").train()
    batch = run(policy.pipeline.training, make_batch(4))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss, metrics = policy.model.loss(batch[SEQUENCE])
        first = float(loss.detach()) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.5 * first and float(metrics["accuracy"]) > 0.5


def test_save_load_round_trip_of_a_parallel_policy(tmp_path):
    policy = parallel_policy("fsq", temperature=1.0)
    batch = make_batch(3)
    before = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(2))
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.decoding == "parallel" and loaded.layout.num_slots == policy.layout.num_slots
    assert torch.equal(loaded.model.slot_embedding.weight, policy.model.slot_embedding.weight)
    after = loaded.predict_action_chunk(batch, generator=torch.Generator().manual_seed(2))
    assert torch.equal(before, after) and loaded.last_decode_info.steps == 1


def test_inspect_traces_a_parallel_policy_slot_by_slot(tmp_path):
    from vla.inspect import inspect_policy

    config = VLAConfig(
        preset="micro",
        time_horizon=T,
        n_action_steps=2,
        device="cpu",
        init_seed=0,
        decoding="parallel",
        text_words=["Task:", ", State:", ";\n", "Action: ", " push"],
    )
    tok = fitted_tokenizers()["bin"]
    policy = VLAPolicy(
        config,
        action_tokenizer=tok,
        action_normalizer=at.Normalizer.identity(D),
        state_normalizer=at.Normalizer.identity(4),
    )
    summary = inspect_policy(policy, tmp_path)
    assert summary["decoding_steps"] == policy.layout.num_slots == T * D  # one step per query slot, no "|" step
    assert_plot(tmp_path / "decoding.png")
