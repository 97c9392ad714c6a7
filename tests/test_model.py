"""The prefix-LM on PaliGemma: presets, the mask matches PaliGemma's own, the loss sees only the suffix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks

from tests.conftest import D, T, fitted_tokenizers
from vla.model.prefix_lm import build_model
from vla.model.presets import PRESETS, get_preset
from vla.model.sequence import SequenceLayout
from vla.model.vocab import VocabMap

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup():
    """A micro model with one camera, a layout and a right-padded batch of 3 rows of different lengths."""
    tok = fitted_tokenizers()["fast"]
    vocab = VocabMap.compact(tok.vocab_size)
    model = build_model("micro", vocab, num_cameras=1, seed=0).eval()
    layout = SequenceLayout(vocab, image_tokens=model.image_tokens, num_cameras=1)
    ids = tok.encode(smooth_chunks(3, T, D, seed=3))
    seq = layout.build_training_sequence(["pick up the red cube", "push", "open it"], np.zeros((3, 4)), ids)
    images = torch.rand(3, 1, 3, 40, 40)  # resized to the preset's 32 px inside
    return model, layout, seq, images, ids


def test_presets_have_the_promised_sizes():
    vocab = VocabMap.compact(1024)
    sizes = {}
    for name in PRESETS:
        with torch.device("meta"):  # shapes only: no memory, no time
            sizes[name] = build_model(name, vocab, num_cameras=1).num_parameters()
    assert 0.5e6 < sizes["tiny"] < 5e6
    assert 20e6 < sizes["small"] < 60e6
    assert 2.0e9 < sizes["paligemma-3b"] < 2.6e9  # + 0.53e9 for PaliGemma's 257k-row embedding = 2.9B
    assert get_preset("paligemma-3b").image_tokens() == 256
    with pytest.raises(ValueError, match="did you mean 'tiny'"):
        get_preset("tinyy")


def test_image_size_must_fit_the_patches():
    with pytest.raises(ValueError, match="multiple of the patch size"):
        build_model("micro", VocabMap.compact(8), image_size=40)


def test_our_4d_mask_equals_paligemmas_token_type_route(setup):
    """PaliGemma's own route (2-D padding mask + token_type_ids) must give the same hidden states as our mask."""
    model, _, seq, images, _ = setup
    with torch.no_grad():
        ours = model(seq.input_ids, seq.attention_mask, seq.position_ids, token_type_ids=seq.ar, images=images)
        theirs = model.backbone.model(
            input_ids=seq.input_ids,
            pixel_values=model.pixel_values(images),
            attention_mask=seq.valid.long(),
            position_ids=seq.position_ids,
            token_type_ids=seq.token_type_ids,
        )
        causal = model.backbone.model(  # and a plain causal mask would differ: the check has teeth
            input_ids=seq.input_ids,
            pixel_values=model.pixel_values(images),
            attention_mask=seq.valid.long(),
            position_ids=seq.position_ids,
            token_type_ids=torch.ones_like(seq.ar),
        )
    v = seq.valid
    torch.testing.assert_close(ours.last_hidden_state[v], theirs.last_hidden_state[v], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours.last_hidden_state[v], causal.last_hidden_state[v], atol=1e-3)


def test_prefix_labels_never_change_the_loss(setup):
    model, _, seq, images, _ = setup
    with torch.no_grad():
        base, _ = model.loss(seq, images)
        scrambled = seq.to("cpu")
        outside = ~seq.loss_mask
        scrambled.targets = torch.where(outside, torch.randint_like(seq.targets, model.vocab_size), seq.targets)
        same, _ = model.loss(scrambled, images)
        changed = seq.to("cpu")
        changed.targets = torch.where(seq.action_mask, (seq.targets + 1) % model.vocab_size, seq.targets)
        other, _ = model.loss(changed, images)
    assert torch.equal(base, same)
    assert not torch.isclose(base, other)  # suffix labels do matter


def test_perturbing_the_suffix_never_changes_the_prefix(setup):
    model, _, seq, images, _ = setup
    perturbed = seq.to("cpu")
    suffix = seq.ar == 1
    perturbed.input_ids = torch.where(suffix, torch.randint_like(seq.input_ids, 4, 200), seq.input_ids)
    with torch.no_grad():
        a = model(seq.input_ids, seq.attention_mask, seq.position_ids, images=images, output_hidden_states=True)
        b = model(
            perturbed.input_ids,
            perturbed.attention_mask,
            perturbed.position_ids,
            images=images,
            output_hidden_states=True,
        )
    prefix = seq.valid & (seq.ar == 0)
    for layer_a, layer_b in zip(a.hidden_states, b.hidden_states, strict=True):  # every layer, embeddings first
        assert torch.equal(layer_a[prefix], layer_b[prefix])
    assert not torch.allclose(a.last_hidden_state[suffix], b.last_hidden_state[suffix])


def test_padding_leaks_nothing(setup):
    """A row alone and the same row in a padded batch give the same loss terms and hidden states."""
    model, layout, seq, images, ids = setup
    with torch.no_grad():
        batched = model(seq.input_ids, seq.attention_mask, seq.position_ids, images=images).last_hidden_state
        alone_seq = layout.build_training_sequence(["push"], np.zeros((1, 4)), [ids[1]])
        alone = model(alone_seq.input_ids, alone_seq.attention_mask, alone_seq.position_ids, images=images[1:2])
    n = int(alone_seq.valid.sum())
    torch.testing.assert_close(batched[1, :n], alone.last_hidden_state[0], rtol=1e-5, atol=1e-5)


def test_state_only_and_missing_images():
    tok = fitted_tokenizers()["bin"]
    vocab = VocabMap.compact(tok.vocab_size)
    model = build_model("micro", vocab, num_cameras=0, seed=0)
    layout = SequenceLayout(vocab)
    seq = layout.build_training_sequence(["push"], np.zeros((1, 4)), tok.encode(smooth_chunks(1, T, D)))
    loss, metrics = model.loss(seq)  # no images anywhere
    assert torch.isfinite(loss) and set(metrics) >= {"loss", "accuracy"}
    with_cams = SequenceLayout(vocab, image_tokens=4, num_cameras=1)
    seq = with_cams.build_training_sequence(["push"], np.zeros((1, 4)), tok.encode(smooth_chunks(1, T, D)))
    with pytest.raises(ValueError, match="no images were given"):
        model.loss(seq)


def test_state_encoder_writes_the_state_into_its_slots():
    vocab = VocabMap.compact(16)
    layout = SequenceLayout(vocab, state_encoding="embedding", state_tokens=2)
    model = build_model("micro", vocab, num_cameras=0, seed=0, state_dim=3, state_tokens=2).eval()
    states = np.array([[0.1, 0.2, 0.3], [-0.5, 0.0, 0.9]])
    seq = layout.build_training_sequence(["push", "push"], states, [[1, 2, 3], [4, 5]])
    loss, _ = model.loss(seq)
    other = layout.build_training_sequence(["push", "push"], states[::-1].copy(), [[1, 2, 3], [4, 5]])
    assert model.loss(other)[0] != loss  # the state reaches the model
    loss.backward()
    assert model.state_encoder.net[0].weight.grad.abs().sum() > 0  # and the encoder learns from the loss
    with pytest.raises(ValueError, match="no state encoder"):
        build_model("micro", vocab, num_cameras=0, seed=0).loss(seq)
    with pytest.raises(ValueError, match="needs state_dim"):
        build_model("micro", vocab, num_cameras=0, state_tokens=1)


def test_loss_trains(setup):
    """A few AdamW steps on one batch lower the loss: gradients reach the model through our mask."""
    _, layout, seq, images, _ = setup
    model = build_model("micro", layout.vocab, num_cameras=1, seed=1).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss, metrics = model.loss(seq, images)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(metrics["loss"])
    assert losses[-1] < 0.7 * losses[0]
