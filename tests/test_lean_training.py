"""The fast training path: ``PrefixLM.loss`` through ``vla.model.lean.suffix_hidden`` (no work on padding, the last layer
only where the loss reads, optionally compiled) gives transformers' loss and gradients; the data path's caches and
batched reads give the very batches they replace."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

import vla.model.lean as lean
from tests.conftest import D, T, fitted_tokenizers
from vla.model.decode import fixed_chunk_length
from vla.model.prefix_lm import build_model
from vla.model.sequence import SequenceLayout
from vla.model.vocab import VocabMap
from vla.policy.pipeline import TokenizeActions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASKS = ["pick up the red cube", "push", "open the top drawer please"]


def batch_for(
    name: str,
    *,
    cameras: int = 1,
    state_encoding: str = "text",
    attention: str = "prefix_lm",
    decoding: str = "autoregressive",
    rows: int = 6,
    seed: int = 0,
):
    """A micro model and a right-padded training batch (rows of different lengths)."""
    tok = fitted_tokenizers()[name]
    vocab = VocabMap.compact(tok.vocab_size)
    embedding = state_encoding == "embedding"
    slots = fixed_chunk_length(tok.constraint(time_horizon=T, action_dim=D)) if decoding == "parallel" else 0
    model = build_model(
        "micro",
        vocab,
        num_cameras=cameras,
        seed=seed,
        state_dim=4 if embedding else None,
        state_tokens=1 if embedding else 0,
        query_slots=slots,
    ).train()
    layout = SequenceLayout(
        vocab,
        image_tokens=model.image_tokens,
        num_cameras=cameras,
        state_encoding=state_encoding,
        attention=attention,
        decoding=decoding,
        num_slots=slots,
    )
    rng = np.random.default_rng(seed)
    ids = tok.encode(smooth_chunks(rows, T, D, seed=seed + 3))
    seq = layout.build_training_sequence([TASKS[i % 3] for i in range(rows)], rng.uniform(-1.2, 1.2, (rows, 4)), ids)
    images = torch.rand(rows, cameras, 3, 40, 40) if cameras else None
    return model, seq, images


def loss_and_grads(model, seq, images, **kw):
    model.zero_grad(set_to_none=True)
    loss, metrics = model.loss(seq, images, **kw)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), metrics, grads


def assert_same_step(reference, got):
    """Same loss and metrics; every gradient the same up to float rounding (relative to the largest gradient: a few
    gradients, such as SigLIP's key biases, are exactly zero in theory and 1e-12 of rounding in practice)."""
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = reference, got
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    for key in ("accuracy", "suffix_tokens"):
        torch.testing.assert_close(metrics_b[key], metrics_a[key], equal_nan=True)
    assert grads_a.keys() == grads_b.keys()
    scale = max(g.abs().max().item() for g in grads_a.values())
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize(
    "name, options",
    [
        ("fast", {}),  # a camera, the state as text
        ("fast", {"state_encoding": "embedding"}),
        ("fast", {"cameras": 0, "state_encoding": "embedding"}),
        ("bin", {"attention": "causal"}),
        ("bin", {"decoding": "parallel", "cameras": 0}),  # query slots: the loss at every slot
    ],
)
def test_lean_loss_and_gradients_equal_transformers_forward(name, options):
    model, seq, images = batch_for(name, **options)
    assert bool((~seq.valid).any())  # the batch is padded: padding is where the lean path skips work
    assert_same_step(loss_and_grads(model, seq, images, lean=False), loss_and_grads(model, seq, images))


def test_lean_loss_is_the_default_and_padding_changes_nothing():
    """The same rows alone and inside a padded batch give the same loss terms on the lean path."""
    model, seq, images = batch_for("fast", rows=3)
    assert lean.LeanSteps.supports(model, training=True) and not lean.LeanSteps.supports(model)
    with torch.no_grad():
        hidden = lean.suffix_hidden(model, seq, images)  # [M, H]
        reference = model(seq.input_ids, seq.attention_mask, seq.position_ids, images=images).last_hidden_state
        torch.testing.assert_close(hidden, reference[seq.loss_mask], rtol=1e-5, atol=1e-5)
        a, _ = model.loss(seq, images)
        b, _ = model.loss(seq, images, lean=False)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_missing_images_are_refused_on_the_lean_path():
    model, seq, _ = batch_for("fast")
    with pytest.raises(ValueError, match="no images were given"):
        model.loss(seq)


def test_compiled_training_step_equals_the_uncompiled_one():
    """torch.compile (inductor) of the layers: the same loss and gradients, over batches of two lengths (dynamic
    shapes: no recompilation needed for the second)."""
    model, seq, images = batch_for("fast", cameras=0, state_encoding="embedding")
    _, short, _ = batch_for("fast", cameras=0, state_encoding="embedding", rows=3, seed=1)
    eager = [loss_and_grads(model, s, None) for s in (seq, short)]
    compiled = [loss_and_grads(model, s, None, compiled=True) for s in (seq, short)]
    assert not getattr(model, lean.COMPILE_FAILED, False), "it compiled (no fallback)"
    for a, b in zip(eager, compiled):
        assert_same_step(a, b)


def test_compile_falls_back_to_the_uncompiled_layers_with_a_warning(monkeypatch, caplog):
    model, seq, images = batch_for("fast")

    def cannot_compile():
        def stack(*args):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        return stack

    tries = []
    monkeypatch.setattr(lean, "_compiled_stack", lambda: tries.append(1) or cannot_compile())
    reference = loss_and_grads(model, seq, images)
    with caplog.at_level(logging.WARNING, logger="vla.model.lean"):
        got = loss_and_grads(model, seq, images, compiled=True)
        again = loss_and_grads(model, seq, images, compiled=True)
    assert len(tries) == 1  # it does not try again every step
    assert "torch.compile could not compile the training step (RuntimeError: InvalidCxxCompiler" in caplog.text
    assert_same_step(reference, got)
    assert_same_step(reference, again)


def test_compile_option_reaches_training(tiny_dataset_root, tmp_path, monkeypatch):
    """`vla train --compile=true` asks every step's loss for the compiled layers (here the uncompiled ones stand in
    for them, so the test stays quick); without it no step asks."""
    from vla.cli import main

    seen = []
    original = lean.suffix_hidden

    def spy(model, seq, images=None, compiled=False):
        seen.append(compiled)
        return original(model, seq, images, compiled)

    monkeypatch.setattr(lean, "_compiled_stack", lambda: lean._packed_stack)
    monkeypatch.setattr("vla.model.prefix_lm.suffix_hidden", spy)
    code = main(
        [
            "train",
            "--config_path=configs/debug.yaml",
            f"--dataset_root={tiny_dataset_root}",
            f"--output_dir={tmp_path / 'run'}",
            "--steps=2",
            "--save_every=2",
            "--progress=false",
            "--compile=true",
        ]
    )
    assert code == 0 and seen and all(seen)
    assert (tmp_path / "run" / "policy" / "model.safetensors").is_file()
    seen.clear()
    args = ["train", "--config_path=configs/debug.yaml", f"--dataset_root={tiny_dataset_root}", "--steps=2"]
    assert main([*args, f"--output_dir={tmp_path / 'plain'}", "--save_every=2", "--progress=false"]) == 0
    assert seen and not any(seen)


# --- the data path ----------------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    picks=st.lists(st.integers(0, 3), min_size=1, max_size=8),
    scale=st.floats(0.5, 1.5),
    encoding=st.sampled_from(["text", "embedding", "none"]),
)
def test_batched_prefixes_equal_row_by_row(picks, scale, encoding):
    """build_training_sequence (which spells each task's prompt once) equals one row at a time, stats included."""
    tasks = [["push", "open it", "pick up the red cube", "x" * 300][i] for i in picks]  # the last one is cut
    states = np.random.default_rng(len(picks)).uniform(-scale, scale, (len(picks), 0 if encoding == "none" else 5))
    tok = fitted_tokenizers()["bin"]
    ids = tok.encode(smooth_chunks(len(picks), T, D, seed=1))

    def layout():
        return SequenceLayout(
            VocabMap.compact(tok.vocab_size),
            image_tokens=2,
            num_cameras=1,
            max_prefix_len=64,
            state_encoding="text" if encoding == "none" else encoding,
        )

    batched, single = layout(), layout()
    for _ in range(2):  # the second batch reads the cache
        seq = batched.build_training_sequence(tasks, states, ids)
        rows = [single.build_training_sequence([t], s[None], [a]) for t, s, a in zip(tasks, states, ids)]
        for i, row in enumerate(rows):
            n = int(row.valid.sum())
            for key in (
                "input_ids",
                "valid",
                "ar",
                "position_ids",
                "targets",
                "loss_mask",
                "action_mask",
                "state_slots",
            ):
                assert torch.equal(getattr(seq, key)[i, :n], getattr(row, key)[0, :n]), key
            assert not seq.valid[i, n:].any()
        assert batched.stats == single.stats


def test_a_cut_task_is_logged_every_time(caplog):
    layout = SequenceLayout(VocabMap.compact(16), max_prefix_len=24, state_encoding="embedding")
    with caplog.at_level(logging.WARNING, logger="vla.model.sequence"):
        for _ in range(2):
            layout.build_training_sequence(["a very long task " * 4], np.zeros((1, 3)), [[1, 2]])
    assert layout.stats.tasks_truncated == 2 and caplog.text.count("too long for max_prefix_len") == 2


def test_tokenize_actions_cache_gives_the_tokenizers_own_ids():
    tok = fitted_tokenizers()["fast"]
    chunks = smooth_chunks(12, T, D, seed=5)
    batch = {"action": np.concatenate([chunks, chunks[:5]])}  # repeats inside one batch
    cached, small = TokenizeActions(tok), TokenizeActions(tok, cache_size=3)
    expected = tok.encode(batch["action"])
    for _ in range(2):  # the second time from the cache
        assert cached(batch)["action_ids"] == expected
        assert small(batch)["action_ids"] == expected
    assert len(cached._cache) == 12 and len(small._cache) == 3
    assert TokenizeActions(tok, cache_size=0)(batch)["action_ids"] == expected


def test_a_batch_read_at_once_equals_samples_read_one_by_one(tiny_image_dataset_root):
    from vla.data.torch_dataset import ActionChunkDataset

    ds = ActionChunkDataset(
        tiny_image_dataset_root,
        T,
        image_size=32,
        backend="memory",
        progress=False,
        image_keys=["observation.images.corner2"],
    )
    picks = [0, 5, len(ds) - 1, 5, -1]
    for got, want in zip(ds.__getitems__(picks), [ds[i] for i in picks], strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])
