"""The vision encoders of ``vla.model.vision``: the keypoint encoder (the spatial softmax, shapes and token count, that it
localises a small object, a policy built with it: lean decoding, save/load, gradients into the conv stem, bad names)
and the conv encoder (shapes, and that a policy built with it learns to act on what its camera shows)."""

from __future__ import annotations

import json

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from torch import nn

from tests.conftest import D, T, fitted_tokenizers
from vla.model.decode import generate
from vla.model.lean import LeanSteps
from vla.model.prefix_lm import build_model
from vla.model.presets import get_preset
from vla.model.vision import ConvEncoder, KeypointEncoder, spatial_softmax
from vla.model.vocab import VocabMap
from vla.policy import VLAConfig, VLAPolicy
from vla.policy.pipeline import IMAGES, SEQUENCE, run

S = 5  # state dimension
CAM = "observation.images.front"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_policy(**overrides) -> VLAPolicy:
    """A micro policy with one camera and the keypoint encoder (the pattern of tests/test_policy.py)."""
    actions = 3.0 * smooth_chunks(200, T, D, seed=7) + 1.0
    states = np.random.default_rng(0).standard_normal((200, S))
    options = dict(
        preset="micro",
        time_horizon=T,
        n_action_steps=4,
        image_keys=[CAM],
        device="cpu",
        init_seed=0,
        vision_encoder="keypoints",
    )
    return VLAPolicy(
        VLAConfig(**(options | overrides)),
        action_tokenizer=fitted_tokenizers()["fast"],
        action_normalizer=at.Normalizer.fit(actions),
        state_normalizer=at.Normalizer.fit(states),
    ).eval()


def make_batch(b: int = 3, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(b, S, generator=g),
        "task": ["push the puck"] * b,
        "action": torch.as_tensor(3.0 * smooth_chunks(b, T, D, seed=seed) + 1.0, dtype=torch.float32),
        "action_is_pad": torch.zeros(b, T, dtype=torch.bool),
        CAM: torch.rand(b, 3, 48, 48, generator=g),  # resized to micro's 32 px inside
    }


def dots(n: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Black images ``[n, 3, size, size]`` in [-1, 1], each with a 3x3 red dot somewhere, and the dots' centres
    ``[n, 2]`` as (x, y) in [-1, 1] on the spatial softmax's grid."""
    rc = torch.randint(1, size - 1, (n, 2), generator=generator)  # row, column of the centre
    images = torch.zeros(n, 3, size, size)
    for i, (r, c) in enumerate(rc.tolist()):
        images[i, 0, r - 1 : r + 2, c - 1 : c + 2] = 1.0
    xy = rc.flip(1).float() / (size - 1) * 2 - 1
    return images * 2 - 1, xy


# --- the spatial softmax ------------------------------------------------------------------------------------
def test_spatial_softmax_gives_a_hot_pixels_coordinate():
    h, w = 5, 7
    logits = torch.zeros(2, 3, h, w)
    hot = [(0, 0), (4, 6), (1, 5)]  # (row, column) per channel
    for k, (r, c) in enumerate(hot):
        logits[:, k, r, c] = 60.0  # exp(60) dwarfs the other 34 cells
    xy, weights = spatial_softmax(logits)
    assert xy.shape == (2, 3, 2) and weights.shape == (2, 3, h * w)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    xs, ys = torch.linspace(-1, 1, w), torch.linspace(-1, 1, h)
    expected = torch.tensor([[xs[c], ys[r]] for r, c in hot])  # x along the columns, y along the rows
    torch.testing.assert_close(xy, expected.expand(2, -1, -1))
    assert torch.equal(xy[0, 0], torch.tensor([-1.0, -1.0])) and torch.equal(xy[0, 1], torch.tensor([1.0, 1.0]))


def test_spatial_softmax_averages_and_its_temperature_flattens():
    logits = torch.zeros(1, 1, 4, 4)
    logits[0, 0, 0, 0] = logits[0, 0, 3, 3] = 60.0  # two equal peaks: their midpoint
    torch.testing.assert_close(spatial_softmax(logits)[0], torch.zeros(1, 1, 2), atol=1e-6, rtol=0)
    logits = torch.zeros(1, 1, 4, 4)
    logits[0, 0, 0, 3] = 3.0  # top-right corner
    sharp, _ = spatial_softmax(logits, 0.1)
    soft, _ = spatial_softmax(logits, 100.0)  # near uniform: near the centre
    torch.testing.assert_close(sharp, torch.tensor([[[1.0, -1.0]]]), atol=1e-6, rtol=0)
    assert soft.abs().max() < 0.01


# --- the encoder --------------------------------------------------------------------------------------------
def test_encoder_shapes_and_input_checks():
    enc = KeypointEncoder(hidden=24, tokens=6)
    out = enc(torch.rand(5, 3, 32, 32) * 2 - 1, output_hidden_states=False)  # SigLIP's keywords are ignored
    assert out.last_hidden_state.shape == (5, 6, 24) and torch.isfinite(out.last_hidden_state).all()
    xy = enc.keypoints_xy(torch.rand(5, 3, 32, 32))
    assert xy.shape == (5, 6, 2) and xy.abs().max() <= 1
    with pytest.raises(ValueError, match=r"RGB images \[B, 3, S, S\] with S a multiple of 4.*\(5, 3, 30, 30\)"):
        enc(torch.rand(5, 3, 30, 30))
    with pytest.raises(ValueError, match="at least 2 conv blocks"):
        KeypointEncoder(hidden=24, tokens=6, channels=(16,))


def test_the_encoder_localises_a_small_dot():
    """The reason it exists: a 3 px dot's position, read through the tokens by a linear head after 150 steps
    (root-mean-square error ~0.03-0.06 of the half-width over seeds; predicting the mean gives 0.56)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc, head = KeypointEncoder(hidden=32, tokens=4), nn.Linear(4 * 32, 2)
        opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=3e-3)
        g = torch.Generator().manual_seed(0)
        for _ in range(150):
            x, y = dots(64, 32, g)
            loss = (head(enc(x).last_hidden_state.flatten(1)) - y).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    x, y = dots(256, 32, torch.Generator().manual_seed(100))
    with torch.no_grad():
        rmse = float((head(enc(x).last_hidden_state.flatten(1)) - y).square().mean().sqrt())
        baseline = float((y - y.mean(0)).square().mean().sqrt())
    assert baseline > 0.5 and rmse < 0.15, (rmse, baseline)


@pytest.mark.parametrize("encoder, kind", [("keypoints", KeypointEncoder), ("conv", ConvEncoder)])
@pytest.mark.parametrize("preset, tokens", [("micro", 4), ("tiny", 16)])
def test_build_model_swaps_the_tower_and_keeps_the_token_count(preset, tokens, encoder, kind):
    vocab = VocabMap.compact(256)
    model = build_model(preset, vocab, num_cameras=1, seed=0, vision_encoder=encoder).eval()
    tower = model.backbone.model.vision_tower
    assert isinstance(tower, kind)
    assert model.image_tokens == get_preset(preset).image_tokens() == tower.tokens == tokens  # one count, everywhere
    assert tower.hidden == model.backbone.config.vision_config.hidden_size  # what the projector reads
    assert not any("vision_model" in name for name, _ in model.named_parameters())  # no SigLIP left behind
    size = model.image_size
    with torch.no_grad():
        features = model.backbone.model.get_image_features(model.pixel_values(torch.rand(2, 1, 3, size, size)))
    assert features.pooler_output.shape == (2, tokens, model.backbone.config.text_config.hidden_size)
    again = build_model(preset, vocab, num_cameras=1, seed=0, vision_encoder=encoder)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name  # the seed fixes the encoder's weights too


# --- the policy ---------------------------------------------------------------------------------------------
def test_a_keypoint_policy_decodes_leanly_and_survives_save_and_load(tmp_path):
    policy = make_policy()
    assert LeanSteps.supports(policy.model)  # so predict_action_chunk's prefill runs through vla.model.lean
    batch = make_batch(b=2)
    before = policy.predict_action_chunk(batch)
    assert before.shape == (2, T, D) and policy.last_decode_info.valid.all()
    prompt = run(policy.pipeline.prompt, batch)
    ids = [
        generate(
            policy.model,
            prompt[SEQUENCE],
            vocab=policy.vocab,
            constraint=policy.constraint,
            images=prompt[IMAGES],
            max_new_tokens=policy.max_new_tokens,
            lean=lean,
        ).ids
        for lean in (True, False)
    ]
    assert ids[0] == ids[1]  # the lean prefill reads the new tower as transformers' forward does

    policy.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["vision_encoder"] == "keypoints"
    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")
    assert isinstance(loaded.model.backbone.model.vision_tower, KeypointEncoder)
    assert torch.equal(before, loaded.predict_action_chunk(batch))
    state, loaded_state = policy.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys() and any(".vision_tower.stem." in key for key in state)
    for key, value in state.items():
        assert torch.equal(value, loaded_state[key]), key


def test_the_loss_reaches_the_conv_stem_and_the_images_matter():
    policy = make_policy().train()
    batch = make_batch()
    loss, _ = policy.forward(batch)
    loss.backward()
    tower = policy.model.backbone.model.vision_tower
    for name, p in [*tower.stem.named_parameters(), ("log_temperature", tower.log_temperature)]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    policy.eval()  # no random shifts: only the images differ between the two losses
    with torch.no_grad():
        same = policy.forward(batch)[0]
        other = policy.forward(batch | {CAM: torch.rand(3, 3, 48, 48, generator=torch.Generator().manual_seed(9))})[0]
    assert not torch.equal(same, other)


def test_a_bad_vision_encoder_name_is_refused_clearly():
    with pytest.raises(
        ValueError,
        match=r"vision_encoder = 'keypoint' is invalid: use one of siglip, keypoints, conv "
        r"or 'auto' .*; did you mean 'keypoints'\?",
    ):
        VLAConfig(vision_encoder="keypoint", device="cpu")
    with pytest.raises(ValueError, match=r"unknown vision encoder 'resnet'.*known: siglip, keypoints, conv"):
        build_model("micro", VocabMap.compact(256), num_cameras=1, vision_encoder="resnet")
    assert VLAConfig(device="cpu").vision_encoder == "siglip"  # the default is unchanged


# --- the conv encoder ---------------------------------------------------------------------------------------
def test_conv_encoder_shapes_and_input_checks():
    enc = ConvEncoder(hidden=24, tokens=6, image_size=32)
    out = enc(torch.rand(5, 3, 32, 32) * 2 - 1, output_hidden_states=False)  # SigLIP's keywords are ignored
    assert out.last_hidden_state.shape == (5, 6, 24) and torch.isfinite(out.last_hidden_state).all()
    assert enc.project.in_features == 32 * 4 * 4  # the 32 px image's 4 x 4 map, flattened
    with pytest.raises(ValueError, match=r"RGB images \[B, 3, 32, 32\], got shape \(5, 3, 40, 40\)"):
        enc(torch.rand(5, 3, 40, 40))
    with pytest.raises(ValueError, match="a multiple of 8, got 36"):
        ConvEncoder(hidden=24, tokens=6, image_size=36)
    with pytest.raises(ValueError, match="3 channel widths"):
        ConvEncoder(hidden=24, tokens=6, image_size=32, channels=(16, 16))


def dot_actions(n: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Black images ``[n, 3, size, size]`` in [0, 1] with a 3x3 white dot in one of 8 columns (any row), and action
    chunks ``[n, 2, 1]`` that say which column: only the camera tells what to do."""
    cols = torch.randint(0, 8, (n,), generator=generator)
    rows = torch.randint(2, size - 3, (n,), generator=generator)
    images = torch.zeros(n, 3, size, size)
    for i, (c, r) in enumerate(zip(cols.tolist(), rows.tolist())):
        x = 2 + c * (size - 5) // 7
        images[i, :, r - 1 : r + 2, x - 1 : x + 2] = 1.0
    return images, (cols.float() / 7 * 2 - 1)[:, None, None].expand(n, 2, 1).contiguous()


def test_a_conv_policy_learns_to_act_on_its_camera():
    """The reason the conv encoder exists: an image-only micro policy whose action is the column of a dot learns it
    (500 steps: held-out loss ~0.08 with the images, ~0.33 with blank ones). With SigLIP or the keypoint encoder the
    same run ends at ~0.20 with or without the images, the loss of ignoring them (README "From pixels")."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        images, actions = dot_actions(512, 32, g)
        norm = at.Normalizer.fit(actions.reshape(-1, 1).numpy())
        tokenizer = at.get_tokenizer_class("bin").fit(norm.normalize(actions.numpy()), n_bins=16)
        config = VLAConfig(
            preset="micro",
            time_horizon=2,
            n_action_steps=2,
            image_keys=[CAM],
            image_size=32,
            state_dim=0,
            device="cpu",
            init_seed=0,
            vision_encoder="conv",
            image_shift=0,
        )
        policy = VLAPolicy(config, action_tokenizer=tokenizer, action_normalizer=norm).train()
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)

        def batch(rows: torch.Tensor, blank: bool = False) -> dict:
            return {
                CAM: torch.zeros_like(images[rows]) if blank else images[rows],
                "action": actions[rows],
                "task": ["go to the dot's column"] * len(rows),
            }

        for _ in range(500):
            loss = policy.forward(batch(torch.randint(0, 448, (32,), generator=g)))[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
        policy.eval()
        held_out = torch.arange(448, 512)
        with torch.no_grad():
            real, blank = (float(policy.forward(batch(held_out, b))[0]) for b in (False, True))
    assert real < 0.15 and blank - real > 0.1, (real, blank)
