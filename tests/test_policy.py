"""The LeRobot policy: config validation, forward, chunks and the action queue, save/load, bad input."""

from __future__ import annotations

import json
import logging

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from lerobot.configs import PreTrainedConfig

from tests.conftest import D, T, fitted_tokenizers, write_gemma_like_tokenizer
from vla.model.text import prompt_words
from vla.policy import VLAConfig, VLAPolicy

S = 5  # state dimension
CAM = "observation.images.front"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def normalizers() -> tuple[at.Normalizer, at.Normalizer]:
    """Raw actions are 3 * chunk + 1 (so normalising matters); raw states are standard normal."""
    actions = 3.0 * smooth_chunks(200, T, D, seed=7) + 1.0
    states = np.random.default_rng(0).standard_normal((200, S))
    return at.Normalizer.fit(actions), at.Normalizer.fit(states)


def make_policy(name: str = "fast", cameras: tuple[str, ...] = (), **overrides) -> VLAPolicy:
    action_norm, state_norm = normalizers()
    options = dict(preset="micro", time_horizon=T, n_action_steps=4, image_keys=list(cameras), device="cpu")
    config = VLAConfig(**(options | {"init_seed": 0} | overrides))
    return VLAPolicy(
        config,
        action_tokenizer=fitted_tokenizers()[name],
        action_normalizer=action_norm,
        state_normalizer=state_norm,
    ).eval()


def make_batch(b: int = 3, cameras: tuple[str, ...] = (), seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "observation.state": torch.randn(b, S, generator=g),
        "task": ["pick up the cube", "push the puck", "open_the_drawer"][:b] + ["push"] * max(0, b - 3),
        "action": torch.as_tensor(3.0 * smooth_chunks(b, T, D, seed=seed) + 1.0, dtype=torch.float32),
        "action_is_pad": torch.zeros(b, T, dtype=torch.bool),
    }
    for cam in cameras:
        batch[cam] = torch.rand(b, 3, 48, 48, generator=g)
    return batch


# --- config --------------------------------------------------------------------------------------------------
def test_config_is_registered_and_carries_what_lerobot_needs():
    assert PreTrainedConfig.get_choice_class("vla") is VLAConfig
    config = VLAConfig(time_horizon=7, n_action_steps=3, device="cpu")
    assert config.type == "vla"
    assert config.action_delta_indices == list(range(7))
    assert config.observation_delta_indices is None and config.reward_delta_indices is None
    # The presets LeRobot's trainer builds: the config's AdamW, warmed up linearly to the peak, decayed to decay_lr.
    config = VLAConfig(
        time_horizon=7, n_action_steps=3, device="cpu", scheduler_warmup_steps=3, scheduler_decay_steps=10
    )
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = config.get_optimizer_preset().build(params)
    assert (
        optimizer.defaults["lr"] == config.optimizer_lr
        and optimizer.defaults["weight_decay"] == config.optimizer_weight_decay
    )
    scheduler = config.get_scheduler_preset().build(optimizer, num_training_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    lrs.append(scheduler.get_last_lr()[0])
    assert (
        lrs[0] == pytest.approx(config.optimizer_lr / 4) and lrs[0] < lrs[1] < lrs[2] < config.optimizer_lr
    )  # warm-up
    assert all(a > b for a, b in zip(lrs[3:], lrs[4:])) and lrs[-1] == pytest.approx(config.scheduler_decay_lr)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_action_steps": 11, "time_horizon": 10}, "n_action_steps = 11"),
        ({"preset": "tinny"}, "did you mean 'tiny'"),
        ({"image_keys": ["front"]}, "observation.images.front"),
        ({"top_p": 0.0}, "top_p = 0.0"),
        ({"temperature": -1.0}, "temperature = -1.0"),
        ({"dtype": "float16"}, "dtype = 'float16'"),
        ({"backbone_path": "/x"}, "preset='paligemma-3b'"),
        ({"action_norm_mode": "quantiles"}, "action_norm_mode"),
        ({"state_encoding": "continuous"}, "state_encoding = 'continuous' is invalid: use one of text, embedding"),
        ({"state_tokens": 0}, "state_tokens = 0"),
        ({"image_shift": -1}, "image_shift = -1"),
        ({"num_beams": 0}, "num_beams = 0"),
        ({"num_beams": 4, "temperature": 0.7}, "needs temperature 0 and decoding='autoregressive'"),
    ],
)
def test_config_errors_name_the_value_and_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        VLAConfig(device="cpu", **options)


def test_features_fill_in_and_must_agree():
    config = VLAConfig(device="cpu", action_dim=4, state_dim=6, image_keys=[CAM])
    config.validate_features()
    assert config.input_features["observation.state"].shape == (6,)
    assert config.input_features[CAM].shape == (3, 64, 64)
    assert config.output_features["action"].shape == (4,)
    config.image_keys = ["observation.images.frnt"]
    with pytest.raises(ValueError, match="did you mean 'observation.images.front'"):
        config.validate_features()


# --- training and acting -------------------------------------------------------------------------------------
def test_forward_gives_a_loss_and_metrics():
    policy = make_policy(cameras=(CAM,)).train()
    loss, metrics = policy.forward(make_batch(cameras=(CAM,)))
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert {"loss", "accuracy", "tokens_per_chunk", "action_pad_fraction"} <= set(metrics)
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in metrics.values())  # no host sync in forward
    loss.backward()
    assert policy.model.backbone.lm_head.weight.grad is not None


def test_packed_batch_from_the_collate_gives_the_raw_batchs_loss():
    """The DataLoader's collate (the pipeline's training steps in a worker) and a raw batch give the same loss."""
    from vla.policy.pipeline import Collate

    policy = make_policy(cameras=(CAM,)).eval()
    batch = make_batch(cameras=(CAM,))
    samples = [{k: v[i] for k, v in batch.items()} for i in range(3)]
    torch.manual_seed(1)  # in eval mode the raw batch is measured unshifted: the shifted one gives another loss
    shifted = Collate(policy.pipeline.training)(samples)
    assert set(shifted) >= {"sequence", "images"}
    assert not torch.allclose(policy.forward(shifted)[0], policy.forward(batch)[0])
    torch.testing.assert_close(policy.forward(Collate(policy.pipeline.measuring)(samples))[0], policy.forward(batch)[0])
    policy.train()  # in training mode both paths shift: the same random shifts give the same loss
    torch.manual_seed(0)
    packed = Collate(policy.pipeline.training)(samples)
    assert set(packed) >= {"sequence", "images", "tokens_per_chunk", "action_pad_fraction"}
    torch.manual_seed(0)  # the raw batch's pipeline draws the same shifts
    with torch.no_grad():
        torch.testing.assert_close(policy.forward(packed)[0], policy.forward(batch)[0])


def test_step_through_yields_every_intermediate():
    policy = make_policy()
    steps = list(policy.pipeline.step_through(make_batch(b=2)))
    names = [name for name, _ in steps]
    assert names == ["CheckBatch", "Normalize", "StackImages", "ShiftImages", "TokenizeActions", "BuildSequence"]
    normalised = dict(steps)["Normalize"]["action"]
    np.testing.assert_allclose(
        normalised, policy.action_normalizer.normalize(make_batch(b=2)["action"].double().numpy())
    )
    assert len(dict(steps)["TokenizeActions"]["action_ids"]) == 2 and "sequence" in steps[-1][1]


def test_random_shift_moves_each_image_by_whole_pixels_within_its_pad():
    from vla.policy.images import IMAGES, ShiftImages

    torch.manual_seed(0)
    images = torch.rand(8, 2, 3, 12, 12)  # [B, N, 3, S, S]
    assert ShiftImages(0)({IMAGES: images})[IMAGES] is images
    shifted = ShiftImages(2)({IMAGES: images})[IMAGES]
    assert shifted.shape == images.shape
    padded = torch.nn.functional.pad(images.reshape(16, 3, 12, 12), (2,) * 4, mode="replicate")
    offsets = []
    for i, image in enumerate(shifted.reshape(16, 3, 12, 12)):  # each one is a crop of its own padded image
        found = [(y, x) for y in range(5) for x in range(5) if torch.equal(padded[i, :, y : y + 12, x : x + 12], image)]
        assert found, f"image {i} is not a whole-pixel shift of its original"
        offsets.append(found[0])
    assert len(set(offsets)) > 1  # drawn per image, not one shift for the batch


def test_predict_and_the_action_queue():
    policy = make_policy(cameras=(CAM,))
    batch = make_batch(b=2, cameras=(CAM,))
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (2, T, D) and chunk.dtype == torch.float32 and torch.isfinite(chunk).all()
    info = policy.last_decode_info
    assert info.valid.all() and len(info.tokens_per_chunk) == 2 and info.latency_ms > 0
    assert info["valid"] is info.valid  # also readable as a mapping
    policy.reset()
    actions = [policy.select_action(batch) for _ in range(5)]  # n_action_steps = 4: a new chunk at call 5
    assert policy.decode_stats.chunks == 2 + 2 * 2
    for k in range(4):
        torch.testing.assert_close(actions[k], chunk[:, k])  # greedy: the same chunk again
    assert actions[4].shape == (2, D)
    policy.reset()
    assert policy._actions.needs_chunk() and policy._previous_action is None
    policy.config.temporal_ensemble = 0.5  # ACT's ensemble, a chunk every n_action_steps = 4 calls, read at reset
    policy.reset()
    ensembled = [policy.select_action(batch) for _ in range(5)]
    assert policy.decode_stats.chunks == 6 + 2 * 2
    for k in range(4):  # one chunk covers steps 0..3; step 4 averages the first chunk's [4] and the second's [0]
        torch.testing.assert_close(ensembled[k], chunk[:, k])
    w = torch.tensor([1.0, np.exp(-0.5)])
    torch.testing.assert_close(ensembled[4], (w[0] * chunk[:, 4] + w[1] * chunk[:, 0]) / w.sum())


def test_beam_search_chunks_are_at_least_as_probable_as_greedys():
    policy = make_policy(cameras=(CAM,))
    batch = make_batch(b=2, cameras=(CAM,))
    greedy = policy.predict_action_chunk(batch)
    policy.config.num_beams = 4
    beam = policy.predict_action_chunk(batch)
    assert beam.shape == greedy.shape and torch.isfinite(beam).all() and policy.last_decode_info.valid.all()
    policy.config.num_beams = 1
    torch.testing.assert_close(policy.predict_action_chunk(batch), greedy)  # back to greedy, the same chunk


@pytest.mark.parametrize("name", ["fast", "bin", "fsq", "fast_state_embedding"])
def test_save_load_round_trip_gives_the_same_actions(name, tmp_path):
    cameras = (CAM,) if name == "fast" else ()
    if name == "fast_state_embedding":
        words = prompt_words(["pick up the cube", "push the puck"])
        policy = make_policy("fast", state_encoding="embedding", state_tokens=2, text_words=words)
        assert policy.model.state_encoder is not None and policy.vocab.text.words == tuple(words)
    else:
        policy = make_policy(name, cameras=cameras)
    batch = make_batch(cameras=cameras)
    before = policy.predict_action_chunk(batch)
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")
    after = loaded.predict_action_chunk(batch)
    assert torch.equal(before, after)
    assert loaded.vocab.model_vocab_size == policy.vocab.model_vocab_size
    assert getattr(loaded.vocab.text, "words", ()) == getattr(policy.vocab.text, "words", ())
    assert loaded.config.action_dim == D and loaded.config.state_dim == S
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["type"] == "vla" and saved["time_horizon"] == T and saved["preset"] == "micro"
    for key, value in policy.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "action_tokenizer",
        "action_normalizer.json",
        "state_normalizer.json",
        "backbone_config.json",
        "policy_preprocessor.json",
    } <= files
    if name == "fast":  # sampling with the same seed also survives the round trip
        for p in (policy, loaded):
            p.config.temperature = 1.0
        sampled = [p.predict_action_chunk(batch, generator=torch.Generator().manual_seed(1)) for p in (policy, loaded)]
        assert torch.equal(*sampled)


def test_a_folder_missing_its_action_normaliser_is_named_incomplete(tmp_path):
    """A policy built without statistics saves neither normaliser; a folder holding only the state's was damaged or
    copied in part, and says so rather than loading as a policy without statistics."""
    make_policy("bin").save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "action_normalizer.json").unlink()
    with pytest.raises(ValueError, match="holds state_normalizer.json but not action_normalizer.json"):
        VLAPolicy.from_pretrained(tmp_path / "ckpt")


def test_save_is_atomic(tmp_path, monkeypatch):
    policy = make_policy("bin")
    target = tmp_path / "ckpt"
    policy.save_pretrained(target)
    before = sorted(p.name for p in target.iterdir())

    def broken(directory):
        raise OSError("disk full")

    monkeypatch.setattr(policy.action_tokenizer, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        policy.save_pretrained(target)
    assert sorted(p.name for p in target.iterdir()) == before  # the old checkpoint is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # and no temporary folder is left behind


def test_invalid_decodes_fall_back_and_are_counted(caplog):
    """Constraint off and a 2-token budget: nothing decodes; the policy falls back, counts it and logs it."""
    policy = make_policy("bin", constrained=False, max_action_tokens=2)
    batch = make_batch(b=2)
    with caplog.at_level(logging.WARNING, logger="vla.policy"):
        chunk = policy.predict_action_chunk(batch)
    zero = torch.as_tensor(policy.action_normalizer.unnormalize(np.zeros(D)), dtype=torch.float32)
    assert torch.allclose(chunk, zero.expand(2, T, D))
    assert policy.decode_stats.invalid == 2 and policy.decode_stats.fallback_zero == 2
    assert not policy.last_decode_info.valid.any() and "did not decode" in caplog.text
    assert "'chunks': 2, 'invalid': 2" in caplog.text  # the warning's counts include this call's chunks
    # relative dimensions fall back to the middle step added to the observation's state, not the step alone
    relative = [True] + [False] * (D - 1)
    rel = make_policy(
        "bin", constrained=False, max_action_tokens=2, relative_actions=relative, action_state_dims=[0, 1, 2]
    )
    chunk = rel.predict_action_chunk(batch)
    middle = torch.as_tensor(rel.action_normalizer.unnormalize(np.zeros(D)), dtype=torch.float32)
    state = torch.as_tensor(batch["observation.state"], dtype=torch.float32)
    torch.testing.assert_close(chunk[:, :, 0], (middle[0] + state[:, 0])[:, None].expand(2, T))
    torch.testing.assert_close(chunk[:, :, 1:], middle[1:].expand(2, T, D - 1))
    policy._previous_action = torch.ones(2, D)  # as if select_action had executed an action
    chunk = policy.predict_action_chunk(batch)
    assert torch.equal(chunk, torch.ones(2, T, D)) and policy.decode_stats.fallback_previous == 2
    assert policy.decode_stats.valid_rate == 0.0


# --- bad input -----------------------------------------------------------------------------------------------
def test_bad_observations_get_clear_errors():
    policy = make_policy(cameras=(CAM,))
    batch = make_batch(b=2, cameras=(CAM,))
    missing_cam = {k: v for k, v in batch.items() if k != CAM} | {"observation.images.fron": batch[CAM]}
    with pytest.raises(ValueError, match="lacks camera 'observation.images.front'.*did you mean"):
        policy.predict_action_chunk(missing_cam)
    with pytest.raises(ValueError, match="lacks 'observation.state'"):
        policy.predict_action_chunk({k: v for k, v in batch.items() if k != "observation.state"})
    with pytest.raises(ValueError, match="5-D state"):
        policy.predict_action_chunk(batch | {"observation.state": torch.zeros(2, S + 1)})
    with pytest.raises(ValueError, match="lacks 'task'"):
        policy.predict_action_chunk({k: v for k, v in batch.items() if k != "task"})
    with pytest.raises(ValueError, match="one per sample"):
        policy.predict_action_chunk(batch | {"task": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"expected \[B=2, 3, H, W\]"):
        policy.predict_action_chunk(batch | {CAM: torch.zeros(2, 48, 48, 3)})
    with pytest.raises(ValueError, match=rf"expected \[B, {T}, {D}\]"):
        policy.forward(batch | {"action": torch.zeros(2, T + 1, D)})


def test_a_long_task_is_truncated_and_logged(caplog):
    policy = make_policy(max_prefix_len=48)
    batch = make_batch(b=1) | {"task": ["please " * 40]}
    with caplog.at_level(logging.WARNING, logger="vla.model.sequence"):
        chunk = policy.predict_action_chunk(batch)
    assert torch.isfinite(chunk).all() and "too long" in caplog.text
    assert policy.layout.stats.tasks_truncated == 1


def test_a_state_without_its_normaliser_is_refused():
    """Given an action normaliser only, a policy that reads a state would read it raw, far outside the range it
    trained on: refused, naming what to pass; a state normaliser given beside the dataset's statistics is kept."""
    action_norm, state_norm = normalizers()
    tok = fitted_tokenizers()["bin"]
    config = VLAConfig(preset="micro", device="cpu", time_horizon=T, state_dim=S)
    with pytest.raises(ValueError, match="no normaliser for 'observation.state'.*state_normalizer="):
        VLAPolicy(config, action_tokenizer=tok, action_normalizer=action_norm)
    stats = {"action": {"q01": -torch.ones(D), "q99": torch.ones(D)}}  # no state in these statistics
    kept = VLAPolicy(config, action_tokenizer=tok, state_normalizer=state_norm, dataset_stats=stats)
    assert kept.state_normalizer is state_norm
    stateless = VLAPolicy(
        VLAConfig(preset="micro", device="cpu", time_horizon=T, state_dim=0),
        action_tokenizer=tok,
        action_normalizer=action_norm,
    )
    assert stateless.state_normalizer is None


def test_mismatched_parts_are_refused():
    action_norm, state_norm = normalizers()
    tok = fitted_tokenizers()["fast"]
    with pytest.raises(ValueError, match="action_dim disagrees"):
        VLAPolicy(
            VLAConfig(preset="micro", device="cpu", action_dim=D + 1),
            action_tokenizer=tok,
            action_normalizer=action_norm,
            state_normalizer=state_norm,
        )
    with pytest.raises(ValueError, match="time_horizon"):
        VLAPolicy(
            VLAConfig(preset="micro", device="cpu", time_horizon=T + 2),
            action_tokenizer=tok,
            action_normalizer=action_norm,
            state_normalizer=state_norm,
        )


# --- LeRobot's factory ---------------------------------------------------------------------------------------
def test_lerobot_factory_path(tmp_path):
    """Built the way LeRobot's make_policy does: tokenizer from a path, normalisers from the dataset stats."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    assert get_policy_class("vla") is VLAPolicy
    fitted_tokenizers()["bin"].save_pretrained(tmp_path / "tok")
    stats = {
        "action": {"q01": torch.full((D,), -2.0), "q99": torch.full((D,), 4.0), "mean": torch.ones(D)},
        "observation.state": {"q01": -torch.ones(S), "q99": torch.ones(S)},
    }
    config = VLAConfig(preset="micro", device="cpu", time_horizon=T, action_tokenizer_path=str(tmp_path / "tok"))
    policy = get_policy_class("vla")(config=config, dataset_stats=stats, dataset_meta=None).eval()
    assert policy.action_normalizer.mode == "quantile" and config.state_dim == S
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    obs = pre({"observation.state": torch.zeros(S), "task": "push"})  # unbatched in, batched out
    action = post(policy.select_action(obs))
    assert action.shape == (1, D) and action.device.type == "cpu"
    with pytest.raises(ValueError, match="action_tokenizer_path"):
        VLAPolicy(VLAConfig(preset="micro", device="cpu"), dataset_stats=stats)
    bare = VLAPolicy(config).eval()  # no stats (LeRobot's policy contract): built, and refuses to act
    assert bare.action_normalizer is None and bare.state_normalizer is None
    with pytest.raises(ValueError, match="holds no normalisers"):
        bare.select_action({"observation.state": torch.zeros(1, S), "task": ["push"]})


def test_collapsed_quantiles_in_lerobot_stats_are_named(tmp_path, caplog):
    """stats.json's averaged per-episode quantiles can put q01 == q99 on a dimension that varies: said, by index."""
    fitted_tokenizers()["bin"].save_pretrained(tmp_path / "tok")
    state = {"q01": -torch.ones(S), "q99": torch.ones(S), "min": -2 * torch.ones(S), "max": 2 * torch.ones(S)}
    state["q01"][2] = state["q99"][2] = 0.5  # a goal's x: one value per episode, averaged to one point
    stats = {"action": {"q01": -torch.ones(D), "q99": torch.ones(D)}, "observation.state": state}
    config = VLAConfig(preset="micro", device="cpu", time_horizon=T, action_tokenizer_path=str(tmp_path / "tok"))
    with caplog.at_level("WARNING", logger="vla.policy"):
        VLAPolicy(config, dataset_stats=stats)
    assert "observation.state: dimensions [2] vary" in caplog.text and "dataset_meta" in caplog.text
    caplog.clear()
    state["q01"][2], state["q99"][2] = -1.0, 1.0
    with caplog.at_level("WARNING", logger="vla.policy"):
        VLAPolicy(config, dataset_stats=stats)
    assert "q01 == q99" not in caplog.text


def test_a_local_paligemma_checkpoint_loads_offline(tmp_path):
    """The real-checkpoint path on a stand-in: PaliGemma's vocabulary layout, HF's checkpoint format, no network."""
    from transformers import PaliGemmaForConditionalGeneration

    from vla.model.presets import PRESETS, paligemma_config
    from vla.model.text import LocalTextTokenizer
    from vla.model.vocab import VocabMap

    tok = fitted_tokenizers()["fast"]
    checkpoint = tmp_path / "paligemma"
    checkpoint.mkdir()
    write_gemma_like_tokenizer(checkpoint)
    vocab = VocabMap.paligemma(LocalTextTokenizer(checkpoint, size=257152), tok.vocab_size)
    backbone = PaliGemmaForConditionalGeneration(paligemma_config(PRESETS["micro"], vocab, num_cameras=1))
    backbone.save_pretrained(checkpoint)  # config.json + model.safetensors, as published checkpoints are
    action_norm, state_norm = normalizers()
    config = VLAConfig(
        preset="paligemma-3b", backbone_path=str(checkpoint), time_horizon=T, image_keys=[CAM], device="cpu"
    )
    policy = VLAPolicy(config, action_tokenizer=tok, action_normalizer=action_norm, state_normalizer=state_norm)
    embed = policy.model.backbone.model.language_model.embed_tokens.weight
    assert torch.equal(embed, backbone.model.language_model.embed_tokens.weight)  # the checkpoint's weights
    assert policy.vocab.layout == "paligemma" and embed.shape[0] == 257216
    batch = make_batch(b=2, cameras=(CAM,))
    loss, _ = policy.forward(batch)
    assert torch.isfinite(loss)
    chunk = policy.eval().predict_action_chunk(batch)
    assert policy.last_decode_info.valid.all()
    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "text_tokenizer" / "tokenizer.json").is_file()
    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")  # needs neither the checkpoint folder nor a hub
    assert loaded.vocab.layout == "paligemma"
    assert torch.equal(loaded.predict_action_chunk(batch), chunk)


def test_a_causal_policy_trains_and_its_cached_decoding_equals_recomputation():
    """The `causal` ablation end to end: a loss, and KV-cached decoding equal to full recomputation."""
    batch = make_batch(b=2)
    cached = make_policy("fast", attention="causal")
    loss, _ = cached.train().forward(batch)
    assert torch.isfinite(loss)
    observation = {k: v for k, v in batch.items() if k not in ("action", "action_is_pad")}
    a = cached.eval().predict_action_chunk(observation)
    b = make_policy("fast", attention="causal", use_kv_cache=False).predict_action_chunk(observation)
    torch.testing.assert_close(a, b)


def test_camera_images_outside_the_pixel_rule_are_refused():
    from vla.policy.images import camera_image

    ok = np.random.default_rng(0).integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
    as_float = camera_image(ok.astype(np.float32) / 255, "cam", 2, None)
    assert torch.equal(camera_image(ok, "cam", 2, None), as_float)  # uint8 and float/255: one image
    with pytest.raises(ValueError, match=r"is uint16; cameras are uint8 in 0..255 or float in \[0, 1\]"):
        camera_image(ok.astype(np.uint16) * 256, "cam", 2, None)
    with pytest.raises(ValueError, match=r"values in \[0, 255\]; float images must lie in \[0, 1\]"):
        camera_image(np.full((2, 3, 8, 8), 255.0, dtype=np.float32) * (ok > 0), "cam", 2, None)
