"""LeRobot's own commands and pipelines run the policy: the stock ``lerobot-train --policy.type=vla`` (through the
plugin distribution ``lerobot_policy_vla`` that ``make setup`` installs) with no tokenizer given, ``vla eval`` on
its checkpoint, LeRobot's processors and the policy acting exactly as vla's own path, Meta-World's
``observation="lerobot"`` matching LeRobot's own env, and the stock ``lerobot-eval`` scoring a policy trained on
such a recording."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import action_tokenizers as at
import numpy as np
import pytest
import torch

from tests.conftest import fitted_tokenizers

ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
# LeRobot's Meta-World episodes are 500 steps, each rendering two 480 px frames (the policy's and the video's):
# 10-20 minutes of software GL on 2 cores. The eval test shortens LeRobot's episode to this many steps in the
# subprocess and runs the stock lerobot-eval otherwise unchanged.
EVAL_STEPS = 20


def _bin(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent))


def _lerobot_train(root: Path, out: Path, *extra: str) -> Path:
    args = [
        _bin("lerobot-train"),
        "--policy.type=vla",
        "--policy.device=cpu",
        "--policy.preset=micro",
        "--dataset.repo_id=local/push",
        f"--dataset.root={root}",
        f"--output_dir={out}",
        "--steps=2",
        "--batch_size=4",
        "--num_workers=0",
        "--save_freq=2",
        "--log_freq=1",
        "--wandb.enable=false",
        *extra,
    ]
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "checkpoints" / "000002" / "pretrained_model"


def test_the_plugin_distribution_is_what_lerobot_discovers():
    names = [d.metadata.get("Name") for d in importlib.metadata.distributions()]
    assert "lerobot_policy_vla" in names  # LeRobot imports distributions whose name starts with lerobot_policy_
    import lerobot_policy_vla
    from lerobot.configs import PreTrainedConfig

    assert PreTrainedConfig.get_choice_class("vla") is lerobot_policy_vla.VLAConfig


# --- normalisation as LeRobot processor steps ----------------------------------------------------------------------
def _policy_with_a_constant_state_dim():
    """A micro policy whose state has a constant dimension (q01 == q99: where LeRobot's own QUANTILES formula and
    ours part ways), saved and ready for LeRobot's processors."""
    from vla.policy import VLAConfig, VLAPolicy

    rng = np.random.default_rng(0)
    states = rng.standard_normal((300, 5))
    states[:, 3] = 0.25  # constant
    actions = 3.0 * rng.standard_normal((300, 10, 3)) + 1.0
    config = VLAConfig(preset="micro", time_horizon=10, n_action_steps=4, device="cpu", init_seed=0)
    return VLAPolicy(
        config,
        action_tokenizer=fitted_tokenizers()["bin"],
        action_normalizer=at.Normalizer.fit(actions),
        state_normalizer=at.Normalizer.fit(states),
    ).eval()


def _raw_batch(b: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    state = torch.randn(b, 5, generator=g)
    state[:, 3] = 0.25
    return {
        "observation.state": state,
        "task": ["push the puck"] * b,
        "action": 3.0 * torch.randn(b, 10, 3, generator=g) + 1.0,
    }


def _lerobots_pair(folder: Path):
    """The policy and processors LeRobot's commands load from a saved folder."""
    from lerobot.policies.factory import make_pre_post_processors

    from vla.policy import VLAPolicy

    loaded = VLAPolicy.from_pretrained(folder).eval()
    return (loaded, *make_pre_post_processors(loaded.config, pretrained_path=str(folder)))


def test_lerobots_loaded_processors_and_the_policy_give_vlas_actions(tmp_path):
    """The saved processors only batch and move (LeRobot's normaliser steps as identity); the policy normalises, so
    LeRobot's chain (pre-processor, ``predict_action_chunk`` or ``select_action``, post-processor) gives exactly the
    actions of vla's own path, and LeRobot's trainer the same loss."""
    from vla.policy.processor_vla import RETIRED_STEPS, check_processor_files

    policy = _policy_with_a_constant_state_dim()
    policy.save_pretrained(tmp_path / "ckpt")
    check_processor_files(tmp_path / "ckpt")  # our own steps pass the check
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        steps = json.loads((tmp_path / "ckpt" / name).read_text())["steps"]
        assert not {s["registry_name"] for s in steps} & set(RETIRED_STEPS) and all("class" not in s for s in steps)

    loaded, pre, post = _lerobots_pair(tmp_path / "ckpt")
    batch = _raw_batch()
    obs = {k: v for k, v in batch.items() if k != "action"}
    expected = policy.predict_action_chunk(obs)  # vla's own path
    processed = pre(dict(obs))
    assert torch.equal(processed["observation.state"], obs["observation.state"])  # raw: the policy normalises
    assert torch.equal(post(loaded.predict_action_chunk(processed)), expected)

    loaded.reset()
    action = post(loaded.select_action(pre(dict(obs))))  # what lerobot-eval runs
    assert torch.equal(action, expected[:, 0])

    # Training: LeRobot's trainer runs its pre-processor first; the loss is the one vla's own path gives.
    torch.manual_seed(0)
    loss_vla, _ = policy.forward(dict(batch))
    loss_lerobot, _ = loaded.forward(pre(dict(batch)))
    assert torch.allclose(loss_vla, loss_lerobot, atol=1e-6)


def test_relative_actions_run_through_lerobots_chain_as_through_vlas(tmp_path):
    """A policy whose actions are relative to the state: its chunk becomes absolute with the state it was predicted
    from, before ``select_action``'s queue, so the actions LeRobot's chain hands out tick by tick, while the state
    moves on, are vla's own chunk."""
    from vla.policy import VLAConfig, VLAPolicy

    rng = np.random.default_rng(0)
    states = rng.standard_normal((300, 5))
    relative = 0.1 * rng.standard_normal((300, 10, 3))
    config = VLAConfig(
        preset="micro",
        time_horizon=10,
        n_action_steps=4,
        device="cpu",
        init_seed=0,
        relative_actions=[True, True, False],
        action_state_dims=[0, 1, 2],
    )
    policy = VLAPolicy(
        config,
        action_tokenizer=at.BinningTokenizer.fit(at.Normalizer.fit(relative).normalize(relative), n_bins=64),
        action_normalizer=at.Normalizer.fit(relative),
        state_normalizer=at.Normalizer.fit(states),
    ).eval()
    policy.save_pretrained(tmp_path / "ckpt")
    loaded, pre, post = _lerobots_pair(tmp_path / "ckpt")
    obs = {k: v for k, v in _raw_batch(b=1).items() if k != "action"}
    expected = policy.predict_action_chunk(obs)[0]  # [T, 3] absolute: the first two dims carry the state
    offset = obs["observation.state"][0, :2]
    assert not torch.allclose(expected[:, :2] - offset, expected[:, :2], atol=1e-3)
    loaded.reset()
    for t in range(config.n_action_steps):
        moved = {**obs, "observation.state": obs["observation.state"] + t}  # the robot moves; the chunk does not
        assert torch.equal(post(loaded.select_action(pre(dict(moved))))[0], expected[t])


def test_a_folder_saved_with_normalising_processor_steps_acts_normalised_once(tmp_path):
    """Folders saved while normalisation ran in processor steps name ``vla_normalizer_processor`` and
    ``vla_unnormalizer_processor`` (with their offsets and scales beside them): they load through LeRobot, and those
    steps pass the batch through, so the policy's actions are the ones a newly saved folder gives."""
    from safetensors.torch import save_file

    from vla.policy.processor_vla import RetiredNormalizationStep

    policy = _policy_with_a_constant_state_dim()
    policy.save_pretrained(tmp_path / "ckpt")
    state_file = "policy_preprocessor_step_9_vla_normalizer_processor.safetensors"
    n = policy.action_normalizer
    tensors = {"action.offset": torch.from_numpy(n.offset), "action.scale": torch.from_numpy(n.scale)}
    save_file(tensors, str(tmp_path / "ckpt" / state_file))
    for name, registry in (("policy_preprocessor.json", 0), ("policy_postprocessor.json", 1)):
        path = tmp_path / "ckpt" / name
        saved = json.loads(path.read_text())
        step = {"registry_name": f"vla_{'un' if registry else ''}normalizer_processor", "config": {"modes": {}}}
        if not registry:
            step = {**step, "config": {"modes": {"action": "quantile"}}, "state_file": state_file}
        saved["steps"].insert(len(saved["steps"]) - 1, step)
        path.write_text(json.dumps(saved))
    loaded, pre, post = _lerobots_pair(tmp_path / "ckpt")
    assert any(isinstance(step, RetiredNormalizationStep) for step in pre.steps)
    obs = {k: v for k, v in _raw_batch().items() if k != "action"}
    assert torch.equal(post(loaded.predict_action_chunk(pre(dict(obs)))), policy.predict_action_chunk(obs))


# --- LeRobot's policy contract: built from the config and its features alone -------------------------------------
def _features_only_config(tokenizer: str):
    """LeRobot's ``test_policy_defaults`` set-up: ``make_policy_config(name)`` with only the input and output features
    set (here the features of a 5-D state and a 3-D action, and the tokenizer type)."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_policy_config

    config = make_policy_config("vla", action_tokenizer_type=tokenizer, preset="micro", device="cpu")
    config.input_features = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(5,))}
    config.output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(3,))}
    return config


def test_lerobots_policy_contract_builds_saves_and_loads_from_the_config_alone(tmp_path):
    """``get_policy_class("vla")(config)`` with only features set (LeRobot's ``test_policy_defaults``) and its
    save-and-load twin (``test_save_and_load_pretrained``): a binning policy needs no data, and the loaded parameters
    are the saved ones. Without statistics it refuses to act, saying so; given the dataset's statistics (as LeRobot's
    ``make_policy`` passes them) it normalises, and LeRobot's processors change nothing."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    policy_cls = get_policy_class("vla")
    config = _features_only_config("bin")
    policy = policy_cls(config)
    assert policy.action_tokenizer.name == "bin" and policy.action_normalizer is None
    assert (policy.config.state_dim, policy.config.action_dim) == (5, 3)
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = policy_cls.from_pretrained(tmp_path / "ckpt", config=config).eval()
    torch.testing.assert_close(list(policy.parameters()), list(loaded.parameters()))

    obs = {k: v for k, v in _raw_batch().items() if k != "action"}
    with pytest.raises(ValueError, match="holds no normalisers"):
        loaded.predict_action_chunk(dict(obs))
    reference = _policy_with_a_constant_state_dim()  # its normalisers, as LeRobot's dataset stats
    stats = {
        key: {"q01": n.offset - n.scale, "q99": n.offset + n.scale}
        for key, n in (("observation.state", reference.state_normalizer), ("action", reference.action_normalizer))
    }
    given = policy_cls(_features_only_config("bin"), dataset_stats=stats).eval()
    pre, post = make_pre_post_processors(given.config, dataset_stats=stats)
    chunk = post(given.predict_action_chunk(pre(dict(obs))))
    lo, hi = stats["action"]["q01"], stats["action"]["q99"]
    inside = (chunk.numpy() >= lo - 1e-6) & (chunk.numpy() <= hi + 1e-6)  # bins of [-1, 1] in raw units
    assert chunk.shape == (3, 10, 3) and inside.all()


def test_a_tokenizer_that_learns_from_data_is_refused_without_data_saying_what_to_give():
    from lerobot.policies.factory import get_policy_class

    with pytest.raises(ValueError, match="fast tokenizer learns from action chunks.*action_tokenizer_path"):
        get_policy_class("vla")(_features_only_config("fast"))


def test_lerobot_rollouts_inference_engine_runs_the_saved_policy(tmp_path):
    """``lerobot-rollout --policy.path=...`` (LeRobot 0.6's deployment command; ``lerobot-record`` only records
    teleoperation now) loads the policy with its own loader and runs each tick through ``SyncInferenceEngine``: robot
    observation frame -> LeRobot's pre-processor -> ``select_action`` -> post-processor -> named robot action. Here the
    robot is the test: the actions are the ones vla's own path gives."""
    from lerobot.configs import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.rollout.context import _load_pretrained_policy
    from lerobot.rollout.inference.sync import SyncInferenceEngine

    from vla.policy import VLAPolicy

    policy = _policy_with_a_constant_state_dim()
    policy.save_pretrained(tmp_path / "ckpt")
    config = PreTrainedConfig.from_pretrained(tmp_path / "ckpt")
    config.pretrained_path = tmp_path / "ckpt"
    loaded = _load_pretrained_policy(config)
    assert isinstance(loaded, VLAPolicy)
    pre, post = make_pre_post_processors(config, pretrained_path=str(tmp_path / "ckpt"))
    names = ["x", "y", "z"]
    features = {"action": {"dtype": "float32", "shape": (3,), "names": names}}
    engine = SyncInferenceEngine(
        loaded, pre, post, features, names, task="push the puck", device="cpu", robot_type="test"
    )
    engine.reset()
    states = _raw_batch(b=1)["observation.state"]
    expected = policy.predict_action_chunk({"observation.state": states, "task": ["push the puck"]})[0]  # [T, 3]
    for t in range(policy.config.n_action_steps):  # one chunk's actions, one per tick, for the same observation
        action = engine.get_action({"observation.state": states[0].numpy().copy()})
        assert action.shape == (3,)
        assert torch.allclose(action, expected[t], atol=1e-5)


# --- Meta-World with LeRobot's observation ------------------------------------------------------------------------
@pytest.mark.slow
def test_lerobot_observation_is_what_lerobots_metaworld_env_gives():
    """State, image (camera, position, size, flip), key names and instruction equal LeRobot's own env's."""
    from lerobot.envs.metaworld import MetaworldEnv as LeRobotMetaworldEnv
    from lerobot.utils.constants import OBS_IMAGE, OBS_STATE

    from vla.sim import make_env

    ours = make_env("metaworld/push-v3", image_keys=[OBS_IMAGE], observation="lerobot")
    theirs = LeRobotMetaworldEnv("push-v3", obs_type="pixels_agent_pos")
    try:
        assert ours.features[OBS_STATE]["shape"] == (4,) and ours.features[OBS_IMAGE]["shape"] == (480, 480, 3)
        for seed in (1000, 1003):
            obs = ours.reset(seed)
            lr, _ = theirs.reset(seed=seed)
            action = np.array([0.4, -0.3, 0.2, 1.0], dtype=np.float32)
            for _ in range(2):
                assert np.array_equal(obs[OBS_STATE], lr["agent_pos"].astype(np.float32))
                diff = np.abs(ours.last_frames[OBS_IMAGE].astype(int) - lr["pixels"].astype(int))
                # Identical but for a handful of pixels after the first reset (LeRobot's env resets once more).
                assert (diff > 0).mean() < 1e-4 and diff.max() <= 8, ((diff > 0).sum(), diff.max())
                assert obs[OBS_IMAGE].shape == (3, 480, 480)
                obs, *_ = ours.step(action)
                lr, *_ = theirs.step(action)
            assert obs["task"] == theirs.task_description == "Push the puck to a goal"
    finally:
        ours.close()
        theirs.close()
    with pytest.raises(ValueError, match="LeRobot's one camera"):
        make_env("metaworld/push-v3", image_keys=["observation.images.corner3"], observation="lerobot")
    with pytest.raises(ValueError, match="480"):
        make_env("metaworld/push-v3", image_keys=[OBS_IMAGE], image_size=128, observation="lerobot")


# --- the stock commands -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_stock_lerobot_train_fits_a_tokenizer_then_vla_eval_on_its_checkpoint(tiny_dataset_root, tmp_path):
    """No --policy.action_tokenizer_path: the policy fits one on the dataset, with the prompt words, as vla train."""
    from vla.cli import main
    from vla.data import reader
    from vla.model.text import prompt_words
    from vla.policy.fitting import data_normalizers, predicted_chunks
    from vla.policy.saved_config import load_policy_config

    checkpoint = _lerobot_train(tiny_dataset_root, tmp_path / "run")
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["type"] == "vla" and config["action_tokenizer_path"] is None
    # vla train's recipe: the state as an embedding, and the prompt's words in the compact vocabulary
    assert config["state_encoding"] == "embedding"
    assert config["text_words"] == prompt_words(reader.dataset_info(tiny_dataset_root).tasks)
    tok = at.load_tokenizer(checkpoint / "action_tokenizer")  # fitted on the dataset's chunks
    assert tok.name == "fast" and tok.time_horizon == config["time_horizon"] and tok.action_dim == 4
    # The normalisers vla train computes: exact statistics of the dataset's frames, not stats.json's quantiles.
    info = reader.dataset_info(tiny_dataset_root)
    saved = load_policy_config(checkpoint)
    action, state = data_normalizers(info, saved, predicted_chunks(info, saved, None), None)
    for name, expected in (("action_normalizer.json", action), ("state_normalizer.json", state)):
        held = at.Normalizer.load(checkpoint / name)
        np.testing.assert_array_equal(held.offset, expected.offset)
        np.testing.assert_array_equal(held.scale, expected.scale)
    assert (
        main(
            [
                "eval",
                "--policy",
                str(checkpoint),
                "--episodes",
                "1",
                "--max-steps",
                "5",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    assert report["episodes"] == 1 and report["valid_chunk_rate"] == 1.0


@pytest.mark.slow
def test_stock_lerobot_train_fine_tunes_a_saved_policy(tiny_dataset_root, tmp_path):
    """``lerobot-train --policy.path=DIR``: LeRobot hands the new dataset's stats to steps named like its own
    normalisers, which the folder holds as identity; the policy's weights, tokenizer and normalisers are the folder's."""
    from safetensors.torch import load_file

    from vla import train
    from vla.config import TrainConfig
    from vla.policy import VLAConfig, VLAPolicy
    from vla.tokenizer_choice import tokenizer_config

    cfg = TrainConfig(
        dataset_root=str(tiny_dataset_root),
        output_dir=str(tmp_path / "source"),
        steps=2,
        batch_size=4,
        tokenizer=tokenizer_config("bin", n_bins=64),
        save_every=2,
        log_every=1,
        progress=False,
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, device="cpu"),
    )
    source = Path(train.main(cfg)["policy_path"])
    out = tmp_path / "run"
    args = [
        _bin("lerobot-train"),
        f"--policy.path={source}",
        "--policy.device=cpu",
        "--policy.optimizer_lr=1e-9",
        "--policy.scheduler_decay_lr=0",
        "--dataset.repo_id=local/push",
        f"--dataset.root={tiny_dataset_root}",
        f"--output_dir={out}",
        "--steps=2",
        "--batch_size=4",
        "--num_workers=0",
        "--save_freq=2",
        "--log_freq=1",
        "--wandb.enable=false",
    ]
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = out / "checkpoints" / "000002" / "pretrained_model"
    for name in ("action_tokenizer/action_tokenizer.json", "action_normalizer.json", "state_normalizer.json"):
        assert (checkpoint / name).read_bytes() == (source / name).read_bytes(), name
    a, b = load_file(str(source / "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # lr 1e-9: it trained from the saved weights
    loaded = VLAPolicy.from_pretrained(checkpoint)  # LeRobot's saved pipelines pass the folder check
    assert loaded.config.pretrained_path is not None and loaded.action_tokenizer.name == "bin"


def test_lerobots_factory_refuses_a_dataset_of_other_dimensions(tmp_path):
    """What ``lerobot-train --policy.path=DIR`` on another robot's data meets, before the first batch."""
    from vla.policy import VLAPolicy
    from vla.policy.saved_config import load_policy_config

    policy = _policy_with_a_constant_state_dim()  # 5-D state, 3-D actions
    policy.save_pretrained(tmp_path / "ckpt")

    class Meta:  # LeRobotDatasetMetadata's part the factory passes on: info.json's features
        root = tmp_path / "toy"
        features = {
            "observation.state": {"dtype": "float32", "shape": [2]},
            "action": {"dtype": "float32", "shape": [2]},
        }

    config = load_policy_config(tmp_path / "ckpt")
    with pytest.raises(
        ValueError, match=r"reads and writes 3-D actions, 5-D state, but .*toy has 2-D actions, 2-D state"
    ):
        VLAPolicy.from_pretrained(tmp_path / "ckpt", config=config, dataset_meta=Meta())


@pytest.mark.slow
def test_stock_lerobot_eval_scores_a_policy_trained_on_a_lerobot_recording(tmp_path):
    """A state-only recording in LeRobot's convention (agent_pos: recording LeRobot's 480 px image costs ~1 s a
    frame here), the stock lerobot-train, then LeRobot's evaluator on its own Meta-World env."""
    from vla.sim.record import record

    root = tmp_path / "push_lerobot"
    record("metaworld/push-v3", 2, root, env_options={"observation": "lerobot"}, progress=False)
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["features"]["observation.state"]["shape"] == [4]
    checkpoint = _lerobot_train(root, tmp_path / "run")
    patch = (
        "import sys, lerobot.envs.metaworld as m\n"
        "init = m.MetaworldEnv.__init__\n"
        f"def short(self, *a, **k):\n    init(self, *a, **k)\n    self._max_episode_steps = {EVAL_STEPS}\n"
        "m.MetaworldEnv.__init__ = short\n"
        "from lerobot.scripts.lerobot_eval import main\n"
        "sys.argv[0] = 'lerobot-eval'\n"
        "sys.exit(main())\n"
    )
    args = [
        sys.executable,
        "-c",
        patch,
        "--env.type=metaworld",
        "--env.task=push-v3",
        f"--policy.path={checkpoint}",
        "--policy.device=cpu",
        "--eval.n_episodes=1",
        "--eval.batch_size=1",
        f"--output_dir={tmp_path / 'eval'}",
    ]
    done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    overall = report["overall"]
    assert overall["n_episodes"] == 1 and 0.0 <= overall["pc_success"] <= 100.0
    assert np.isfinite(overall["avg_sum_reward"])
