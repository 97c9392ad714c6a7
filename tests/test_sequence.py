"""The token layout: vocabulary map, prompt text, the prefix-LM mask, padding, loss mask, every tokenizer."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import D, T, fitted_tokenizers
from vla.model.sequence import SequenceLayout, prefix_lm_mask
from vla.model.text import ByteTextTokenizer, LocalTextTokenizer, clean_task, prompt_words
from vla.model.vocab import VocabMap

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- vocabulary ----------------------------------------------------------------------------------------------
def test_compact_vocab_maps_actions_after_the_text_ids():
    vm = VocabMap.compact(action_vocab_size=300)
    text = ByteTextTokenizer()
    assert vm.model_vocab_size == text.size + 300
    assert vm.action_id_range == (text.size, text.size + 300)
    ids = np.arange(300)
    assert (vm.vocab_to_action(vm.action_to_vocab(ids)) == ids).all()
    assert (vm.vocab_to_action(np.arange(text.size)) == -1).all()  # text ids are not actions
    assert vm.vocab_to_action(np.array([vm.model_vocab_size])).tolist() == [-1]
    t = torch.tensor([text.size, 0])
    assert vm.vocab_to_action(t).tolist() == [0, -1]  # tensors too
    assert vm.end_id == text.encode("|")[0] and vm.marker_ids == tuple(text.encode("Action: "))


def test_byte_text_tokenizer_round_trips_any_string():
    text = ByteTextTokenizer()
    for s in ["Task: pick up the cube, State: 1 2 3;\n", "é ✓ 漢字", ""]:
        ids = text.encode(s)
        assert all(text.offset <= i < text.size for i in ids)
        assert text.decode(ids) == s


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(min_size=1, max_size=6), max_size=6, unique=True))
def test_byte_text_tokenizer_with_words_round_trips(s, words):
    text = ByteTextTokenizer(words)
    ids = text.encode(s)
    assert all(text.offset <= i < text.size for i in ids) and text.decode(ids) == s


def test_prompt_words_shorten_the_prompt():
    words = prompt_words(["push the puck to a goal", "Pick_up the cube"])
    assert words[:4] == ["Task:", ", State:", ";\n", "Action: "] and " pick" in words and " the" in words
    assert len(set(words)) == len(words)
    plain, worded = SequenceLayout(VocabMap.compact(16)), SequenceLayout(VocabMap.compact(16, words))
    state = np.array([0.0, 0.5, -1.0])
    a, b = (
        plain.prefix_text_ids("push the puck to a goal", state),
        worded.prefix_text_ids("push the puck to a goal", state),
    )
    assert worded.vocab.text.decode(b) == plain.vocab.text.decode(a)  # the same text
    assert len(b) == 1 + 8 + 3 + 1  # BOS, 8 words, 3 numbers, ";\n"
    assert len(a) == 1 + 37 + 3 + 2
    assert worded.vocab.marker_ids == (worded.vocab.text.word_offset + 3,)
    with pytest.raises(ValueError, match="distinct non-empty"):
        ByteTextTokenizer(["a", "a"])


def test_paligemma_vocab_uses_openpi_mapping(gemma_like_dir):
    text = LocalTextTokenizer(gemma_like_dir, size=257152)
    assert (text.pad_id, text.eos_id, text.bos_id, text.image_id) == (0, 1, 2, 257152)
    vm = VocabMap.paligemma(text, action_vocab_size=1024)
    ids = np.arange(1024)
    assert (vm.action_to_vocab(ids) == 257152 - 1 - 128 - ids).all()  # openpi: V - 1 - 128 - t
    assert (vm.vocab_to_action(vm.action_to_vocab(ids)) == ids).all()
    assert vm.vocab_to_action(np.array([5, 257152 - 129 + 1])).tolist() == [-1, -1]
    layout = SequenceLayout(vm)
    seq = layout.build_training_sequence(["pick"], np.zeros((1, 2)), [[0, 7]])
    suffix = seq.input_ids[0, seq.ar[0] == 1].tolist()
    assert suffix == [*vm.marker_ids, 257023, 257016, vm.end_id, text.eos_id]


def test_local_text_tokenizer_needs_a_tokenizer_file(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LocalTextTokenizer(tmp_path)


# --- prompt text ---------------------------------------------------------------------------------------------
def test_prompt_text_follows_pi0_fast():
    layout = SequenceLayout(VocabMap.compact(16))
    ids = layout.prefix_text_ids("  Pick_Up the\nCube ", np.array([-1.0, 0.0, 1.0, 1.5]))
    assert ids[0] == ByteTextTokenizer.bos_id
    assert ByteTextTokenizer().decode(ids[1:]) == "Task: pick up the cube, State: 0 128 255 255;\n"
    assert layout.stats.state_clipped == 1  # 1.5 was clipped, and counted
    assert clean_task("Open_the DRAWER") == "open the drawer"


def test_embedding_state_slots_replace_the_numbers():
    vocab = VocabMap.compact(16)
    text, emb = SequenceLayout(vocab), SequenceLayout(vocab, state_encoding="embedding", state_tokens=2)
    states = np.array([[0.5, -3.0, 0.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    a, b = text.build_prefix(["push", "push"], states), emb.build_prefix(["push", "push"], states)
    assert not a.state_slots.any() and b.state_slots.sum(dim=1).tolist() == [2, 2]
    assert (b.input_ids[b.state_slots] == vocab.text.pad_id).all() and b.valid[b.state_slots].all()
    assert b.input_ids.shape[1] == a.input_ids.shape[1] - 3  # " " + 2 slots instead of 6 number words
    assert b.state.tolist()[0] == [0.5, -1.0, 0.0, 0.0, 0.0, 0.0]  # clipped to [-1, 1], as the text path clips
    assert emb.stats.state_clipped == 1
    prompt = vocab.text.decode(b.input_ids[0][b.valid[0] & ~b.state_slots[0]].tolist()[1:])
    assert prompt.startswith("Task: push, State: ;\n")  # the slots sit between "State: " and ";"
    with pytest.raises(ValueError, match="state_encoding must be one of"):
        SequenceLayout(vocab, state_encoding="numbers")


def test_state_bins_match_numpy_digitize():
    layout = SequenceLayout(VocabMap.compact(16), state_bins=256)
    x = np.random.default_rng(0).uniform(-1, 1, 1000)
    expected = np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1
    assert (layout.state_bins_of(x) == expected).all()
    with pytest.raises(ValueError, match="NaN"):
        layout.state_bins_of(np.array([np.nan]))


def test_a_long_task_is_cut_and_logged(caplog):
    layout = SequenceLayout(VocabMap.compact(16), max_prefix_len=64)
    with caplog.at_level(logging.WARNING, logger="vla.model.sequence"):
        ids = layout.prefix_text_ids("a very long task " * 20, np.zeros(3))
    assert len(ids) == 64
    assert layout.stats.tasks_truncated == 1 and "too long" in caplog.text
    with pytest.raises(ValueError, match="raise max_prefix_len"):
        layout.prefix_text_ids("t", np.zeros(80))  # the state alone does not fit


# --- the mask ------------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=4), left=st.booleans())
def test_prefix_lm_mask_properties(rows, left):
    """For random prefix/suffix lengths and either padding side: the mask is exactly the prefix-LM rule."""
    width = max(p + s for p, s in rows) + 1
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    ar = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (p, s) in enumerate(rows):
        start = width - p - s if left else 0
        valid[i, start : start + p + s] = True
        ar[i, start + p : start + p + s] = 1
    mask = prefix_lm_mask(valid, ar)
    for i, (p, s) in enumerate(rows):
        idx = torch.nonzero(valid[i]).flatten().tolist()
        pre, suf = idx[:p], idx[p:]
        m = mask[i]
        assert not m[~valid[i]].any() and not m[:, ~valid[i]].any()  # padding attends to nothing, and is unseen
        assert m[pre][:, pre].all()  # the prefix is bidirectional
        if suf:
            assert not m[pre][:, suf].any()  # the prefix never sees the suffix
            assert m[suf][:, pre].all()  # the suffix sees the whole prefix
            sub = m[suf][:, suf]
            assert torch.equal(sub, torch.tril(torch.ones_like(sub)))  # causal inside the suffix


@pytest.mark.parametrize("left", [False, True])
def test_causal_attention_sees_nothing_later_and_keeps_the_loss_on_the_suffix(left):
    """``attention="causal"``: no position sees a later one (prefix included); padding, targets and loss as before."""
    vocab = VocabMap.compact(256)
    tasks, states, ids = ["push", "pick up the cube"], np.zeros((2, 3)), [[1, 2, 3], [4]]
    causal = SequenceLayout(vocab, state_bins=16, attention="causal")
    prefix_lm = SequenceLayout(vocab, state_bins=16)
    build = (
        (lambda lay: lay.build_prefix(tasks, states))
        if left
        else (lambda lay: lay.build_training_sequence(tasks, states, ids))
    )
    a, b = build(causal), build(prefix_lm)
    mask = a.attention_mask
    for i in range(2):
        idx = torch.nonzero(a.valid[i]).flatten()
        sub = mask[i][idx][:, idx]
        assert torch.equal(sub, torch.tril(torch.ones_like(sub)))  # exactly "earlier or itself"
        assert not mask[i][~a.valid[i]].any() and not mask[i][:, ~a.valid[i]].any()
    assert not torch.equal(mask, b.attention_mask)  # the prefix-LM's prefix sees ahead within the prefix
    for field in ("input_ids", "valid", "position_ids", "targets", "loss_mask", "action_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    with pytest.raises(ValueError, match="attention must be one of prefix_lm, causal"):
        SequenceLayout(vocab, attention="bidirectional")


@pytest.mark.parametrize("name", ["fast", "fast_byte_level", "bin", "fsq"])
def test_training_sequence_for_every_tokenizer(name):
    tok = fitted_tokenizers()[name]
    chunks = smooth_chunks(3, T, D, seed=5)
    ids = tok.encode(chunks)
    layout = SequenceLayout(VocabMap.compact(tok.vocab_size), image_tokens=4, num_cameras=2)
    tasks = ["pick up the cube", "push", "open the drawer please"]
    seq = layout.build_training_sequence(tasks, np.zeros((3, 5)), ids)
    b, width = seq.input_ids.shape
    for i in range(b):
        v = seq.valid[i]
        n = int(v.sum())
        assert v[:n].all() and not v[n:].any()  # right-padded
        assert seq.position_ids[i, :n].tolist() == list(range(n))  # padding takes no position
        assert (seq.input_ids[i, :8] == ByteTextTokenizer.image_id).all()  # 2 cameras x 4 image tokens first
        suffix = seq.input_ids[i][seq.ar[i] == 1]
        assert len(suffix) == len("Action: ") + len(ids[i]) + 2
        assert layout.vocab.vocab_to_action(suffix[8:-2]).tolist() == ids[i]  # the ids survive the map
        assert suffix[-2] == layout.vocab.end_id and suffix[-1] == ByteTextTokenizer.eos_id
        # The loss mask covers exactly the positions that predict suffix tokens: never a prefix token.
        targets = seq.loss_mask[i].nonzero().flatten() + 1
        assert (seq.ar[i, targets] == 1).all() and len(targets) == len(suffix)
        assert int(seq.action_mask[i].sum()) == len(ids[i])
        assert int(seq.prefix_len[i]) == 8 + len(layout.prefix_text_ids(tasks[i], np.zeros(5)))


def test_prefix_is_left_padded_and_ends_with_the_marker():
    layout = SequenceLayout(VocabMap.compact(16))
    seq = layout.build_prefix(["a", "a much longer task"], np.zeros((2, 3)))
    marker = list(layout.vocab.marker_ids)
    for i in range(2):
        assert seq.input_ids[i, -len(marker) :].tolist() == marker
        assert seq.valid[i, -1] and (seq.ar[i, -len(marker) :] == 1).all()
        n = int(seq.valid[i].sum())
        assert not seq.valid[i, : seq.input_ids.shape[1] - n].any()
        assert seq.position_ids[i, -1] == n - 1
    assert (seq.loss_mask.sum(1) == len(marker)).all()  # the marker is suffix: a prompt could be scored


def test_bad_batches_are_refused():
    layout = SequenceLayout(VocabMap.compact(16))
    with pytest.raises(ValueError, match="list of strings"):
        layout.build_prefix("pick", np.zeros((1, 3)))
    with pytest.raises(ValueError, match="one task per sample"):
        layout.build_prefix(["a", "b"], np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        layout.build_prefix(["a"], np.zeros(3))
    with pytest.raises(ValueError, match="one row per sample"):
        layout.build_training_sequence(["a"], np.zeros((1, 3)), [[1], [2]])
