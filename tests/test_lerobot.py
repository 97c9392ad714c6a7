"""LeRobot's own commands and pipelines run the policy: the stock ``lerobot-train --policy.type=vla`` (through the
plugin distribution ``lerobot_policy_vla`` that ``make setup`` installs) with no tokenizer given, ``vla eval`` on
its checkpoint, LeRobot's processors normalising exactly as vla does, Meta-World's ``observation="lerobot"``
matching LeRobot's own env, and the stock ``lerobot-eval`` scoring a policy trained on such a recording."""

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


def test_lerobots_loaded_processors_and_the_policy_give_vlas_actions(tmp_path):
    from lerobot.policies.factory import make_pre_post_processors

    from vla.policy import VLAPolicy
    from vla.policy.processor_vla import NORMALIZER_STEP, UNNORMALIZER_STEP, check_processor_files

    policy = _policy_with_a_constant_state_dim()
    policy.save_pretrained(tmp_path / "ckpt")
    check_processor_files(tmp_path / "ckpt")  # our own steps pass the check
    pre_file = json.loads((tmp_path / "ckpt" / "policy_preprocessor.json").read_text())
    names = [s["registry_name"] for s in pre_file["steps"]]
    assert NORMALIZER_STEP in names and all("class" not in s for s in pre_file["steps"])
    assert (tmp_path / "ckpt" / pre_file["steps"][names.index(NORMALIZER_STEP)]["state_file"]).is_file()
    post_file = json.loads((tmp_path / "ckpt" / "policy_postprocessor.json").read_text())
    assert UNNORMALIZER_STEP in [s["registry_name"] for s in post_file["steps"]]

    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")
    pre, post = make_pre_post_processors(loaded.config, pretrained_path=str(tmp_path / "ckpt"))
    batch = _raw_batch()
    obs = {k: v for k, v in batch.items() if k != "action"}
    expected = policy.predict_action_chunk(obs)  # vla's own path: the policy normalises itself
    normalised = pre(dict(obs))
    assert normalised["vla.normalized"] is True
    state_norm = policy.state_normalizer.normalize(obs["observation.state"].double().numpy())
    assert np.array_equal(normalised["observation.state"].numpy(), state_norm)  # exact, constant dim at 0
    assert np.allclose(normalised["observation.state"][:, 3].numpy(), 0.0)
    chunk = loaded.predict_action_chunk(normalised)  # normalised chunks: the policy did not unnormalise
    assert not torch.allclose(chunk, expected, atol=1e-3)
    assert torch.allclose(post(chunk), expected, atol=1e-5)  # float32 rounding of the normalised chunk only

    loaded.reset()
    action = post(loaded.select_action(pre(dict(obs))))  # what lerobot-eval runs
    assert torch.allclose(action, expected[:, 0], atol=1e-5)

    # Training: LeRobot's trainer normalises the batch first; the loss is the one vla's own path gives.
    torch.manual_seed(0)
    loss_vla, _ = policy.forward(dict(batch))
    loss_lerobot, _ = loaded.forward(pre(dict(batch)))
    assert torch.allclose(loss_vla, loss_lerobot, atol=1e-6)


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
    are the saved ones. Normalisation is then the processors' (built from the dataset's stats): the policy reads the
    normalised batch they give, refuses a raw one saying so, and the post-processor returns raw actions."""
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
    pre, post = make_pre_post_processors(loaded.config, dataset_stats=stats)
    normalised = pre(dict(obs))
    assert normalised["vla.normalized"] is True
    chunk = post(loaded.predict_action_chunk(normalised))
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


def test_normalisation_steps_without_their_state_are_refused(tmp_path):
    from vla.policy.processor_vla import VLANormalizerProcessorStep

    step = VLANormalizerProcessorStep(modes={"observation.state": "quantile"})
    with pytest.raises(ValueError, match="state lacks observation.state.offset"):
        step.load_state_dict({})
    with pytest.raises(ValueError, match="no statistics"):
        step._apply("observation.state", torch.zeros(1, 2), False, None)


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
    from vla.policy.processor_vla import NORMALIZER_STEP

    checkpoint = _lerobot_train(tiny_dataset_root, tmp_path / "run")
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["type"] == "vla" and config["action_tokenizer_path"] is None
    # vla train's recipe: the state as an embedding, and the prompt's words in the compact vocabulary
    assert config["state_encoding"] == "embedding"
    assert config["text_words"] == prompt_words(reader.dataset_info(tiny_dataset_root).tasks)
    tok = at.load_tokenizer(checkpoint / "action_tokenizer")  # fitted on the dataset's chunks
    assert tok.name == "fast" and tok.time_horizon == config["time_horizon"] and tok.action_dim == 4
    steps = json.loads((checkpoint / "policy_preprocessor.json").read_text())["steps"]
    assert NORMALIZER_STEP in [s["registry_name"] for s in steps]  # the trainer's own processors, saved
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
