"""Closed-loop evaluation with a tiny (untrained) policy, and the demo's quick mode end to end."""

import argparse
import json
import math

import numpy as np
import pytest

from tests.conftest import assert_plot
from vla import evaluate, train
from vla.config import TrainConfig
from vla.execution import COMMITTED
from vla.policy import VLAConfig
from vla.tokenizer_choice import tokenizer_config


@pytest.fixture(scope="module")
def tiny_policy(tiny_dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(
        dataset_root=str(tiny_dataset_root),
        output_dir=str(out),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=4, scheduler_warmup_steps=1, device="cpu"),
        steps=2,
        batch_size=4,
        save_every=2,
        progress=False,
    )
    return train.main(cfg)["policy_path"]


def test_evaluation_runs_short_episodes(tiny_policy, tmp_path):
    report = evaluate.evaluate(
        tiny_policy, "metaworld/push-v3", episodes=2, max_steps=12, out_dir=tmp_path, progress=False
    )
    saved = json.loads((tmp_path / "eval_info.json").read_text())
    assert saved["episodes"] == 2 and saved["lengths"] == [12, 12]  # an untrained policy does not succeed
    assert saved["chunks"] == 6 and saved["valid_chunk_rate"] == 1.0  # constrained: every chunk decodes
    assert report["latency_ms_mean"] > 0 and report["tokens_per_chunk"] >= 1
    assert min(saved["seeds"]) >= evaluate.EVAL_SEED_START


def test_the_state_clipped_to_the_training_range_is_counted_per_chunk(tiny_policy):
    """A state inside the training range is not clipped; one far outside it is, and the runner counts the clipped
    values of its own calls only (not the latency re-runs, nor the chunks a commit search decodes), which the report
    gives per chunk."""
    from vla.policy import VLAPolicy
    from vla.sim import make_env

    policy = VLAPolicy.from_pretrained(tiny_policy)
    with make_env("metaworld/push-v3") as env:
        obs = env.reset(evaluate.EVAL_SEED_START)
    runner = evaluate.ChunkPolicy(policy)
    runner([obs, obs])
    inside = runner.state_clipped
    far = {**obs, "observation.state": obs["observation.state"] + 100.0 * policy.state_normalizer.scale}
    runner([far])
    assert runner.state_clipped - inside == policy.config.state_dim  # every dimension past q99
    runner.single_latencies()
    assert runner.state_clipped - inside == policy.config.state_dim
    # committed actions make decoding search several chunks for the one observation: still counted once
    assert policy.config.commit_search > 1
    committed = {**far, COMMITTED: policy.action_normalizer.unnormalize(np.zeros((2, policy.config.action_dim)))}
    runner([committed])
    assert runner.state_clipped - inside == 2 * policy.config.state_dim
    report = evaluate._decoding(runner, 4, None, 1, 1)
    assert report["state_clipped_per_chunk"] == runner.state_clipped / 4


def test_evaluation_does_not_depend_on_how_many_envs_run_at_once(tiny_policy):
    one = evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=3, max_steps=8, num_envs=1, progress=False)
    three = evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=3, max_steps=8, num_envs=3, progress=False)
    assert three["num_envs"] == 3 and one["num_envs"] == 1
    np.testing.assert_allclose(three["returns"], one["returns"], rtol=1e-6)
    assert three["chunks"] == one["chunks"] == 6


def test_evaluation_with_beam_search_reports_it(tiny_policy, tmp_path):
    report = evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, max_steps=8, num_beams=3, progress=False)
    assert report["num_beams"] == 3 and report["valid_chunk_rate"] == 1.0 and report["chunks"] == 2
    with pytest.raises(ValueError, match="num_beams = 0"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, num_beams=0, progress=False)


def test_evaluation_rejects_training_seeds_and_missing_policy(tiny_policy, tmp_path):
    with pytest.raises(ValueError, match="overlap training seeds"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, seed_start=0, progress=False)
    with pytest.raises(ValueError, match="no policy at"):
        evaluate.evaluate(tmp_path / "nothing", "metaworld/push-v3", episodes=1, progress=False)


def test_demo_quick_reports_every_tokenizer(tmp_path):
    from vla.cli import main

    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "demo.json").read_text())
    assert set(result["tokenizers"]) == {"fast", "bin", "fsq"}
    for row in result["tokenizers"].values():
        assert 0.0 <= row["success_rate"] <= 1.0 and np.isfinite(row["final_loss"])
        assert row["valid_chunk_rate"] == 1.0
        assert set(row["tasks"]) == {"drawer-open-v3", "drawer-close-v3"}  # the quick demo's two tasks
    assert_plot(tmp_path / "demo.png")
    assert_plot(tmp_path / "demo_tasks.png")
    assert "| drawer-close-v3 |" in (tmp_path / "demo.md").read_text()


def test_evaluation_over_several_tasks_reports_each(tiny_policy, tmp_path):
    names = "metaworld/drawer-open-v3,drawer-close-v3"
    report = evaluate.evaluate(
        tiny_policy, names, episodes=2, max_steps=6, num_envs=4, out_dir=tmp_path, progress=False
    )
    assert set(report["tasks"]) == {"metaworld/drawer-open-v3", "metaworld/drawer-close-v3"}
    assert report["episodes"] == 4 and report["num_envs"] == 4
    for task in report["tasks"].values():
        assert task["episodes"] == 2 and task["lengths"] == [6, 6] and min(task["seeds"]) >= evaluate.EVAL_SEED_START
    assert report["success_rate"] == np.mean([t["success_rate"] for t in report["tasks"].values()])
    assert "| drawer-open-v3 |" in (tmp_path / "eval_tasks.md").read_text()
    assert_plot(tmp_path / "eval_tasks.png")


def test_evaluation_in_lerobots_observation_convention(tmp_path):
    from vla.sim.record import record

    root = tmp_path / "agent_pos"
    record("metaworld/push-v3", 2, root, env_options={"observation": "lerobot"}, progress=False)
    cfg = TrainConfig(
        dataset_root=str(root),
        output_dir=str(tmp_path / "run"),
        tokenizer=tokenizer_config("bin", n_bins=16),
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=4, scheduler_warmup_steps=1, device="cpu"),
        steps=2,
        batch_size=4,
        save_every=2,
        progress=False,
    )
    policy = train.main(cfg)["policy_path"]
    report = evaluate.evaluate(
        policy, "metaworld/push-v3", episodes=1, max_steps=8, env_options={"observation": "lerobot"}, progress=False
    )
    assert report["lengths"] == [8] and report["valid_chunk_rate"] == 1.0
    # Without options the convention comes from the training data's recording.json
    assert evaluate.training_recording(policy)["env_options"] == {"observation": "lerobot"}
    with pytest.raises(ValueError, match="4-D state but metaworld/push-v3 gives 39 values.*--observation"):
        evaluate.evaluate(
            policy,
            "metaworld/push-v3",
            episodes=1,
            max_steps=8,
            env_options={"observation": "privileged"},
            progress=False,
        )


def test_camera_policy_from_proprioception_records_trains_and_evaluates(tmp_path):
    """The camera-policy path end to end: a proprio recording (4-D hand and gripper + our workspace camera, 48 px), a
    micro policy trained at 32 px with random shifts, evaluated with the convention and the camera size read from
    the recording (the pipeline resizes, as in training), and a GIF."""
    from vla.sim.record import record

    root, camera = tmp_path / "pixels", "observation.images.workspace"
    record(
        "metaworld/push-v3",
        2,
        root,
        images=True,
        cameras=[camera],
        image_size=48,
        image_format="png",
        env_options={"observation": "proprio"},
        progress=False,
    )
    cfg = TrainConfig(
        dataset_root=str(root),
        output_dir=str(tmp_path / "run"),
        tokenizer=tokenizer_config("bin", n_bins=16),
        policy=VLAConfig(
            preset="micro",
            time_horizon=4,
            n_action_steps=4,
            scheduler_warmup_steps=1,
            device="cpu",
            image_keys=[camera],
            image_size=32,
            image_shift=2,
        ),
        steps=2,
        batch_size=4,
        save_every=2,
        progress=False,
    )
    policy = train.main(cfg)["policy_path"]
    report = evaluate.evaluate(
        policy, "metaworld/push-v3", episodes=1, max_steps=8, gif_episodes=1, out_dir=tmp_path / "eval", progress=False
    )
    assert report["lengths"] == [8] and report["valid_chunk_rate"] == 1.0
    from PIL import Image

    with Image.open(tmp_path / "eval" / "rollouts.gif") as gif:  # rendered at the recording's 48 px, as in training
        assert gif.size == (48, 48) and gif.n_frames >= 2


def test_the_demo_finds_its_configs_in_a_checkout_and_in_an_installed_wheel(tmp_path):
    import shutil
    import tomllib
    from pathlib import Path

    from vla.demo import configs_dir

    repo = Path(__file__).resolve().parent.parent
    assert configs_dir() == repo / "configs"
    wheel = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["force-include"]["configs"] == "vla/configs"  # the wheel carries them there
    installed = tmp_path / "site-packages" / "vla"
    shutil.copytree(repo / "configs", installed / "configs")
    assert configs_dir(installed) == installed / "configs"
    with pytest.raises(FileNotFoundError, match="reinstall"):
        configs_dir(tmp_path / "elsewhere" / "vla")


def test_evaluation_behind_a_delay(tiny_policy, tmp_path):
    now = evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=2, max_steps=16, num_envs=2, progress=False)
    zero = evaluate.evaluate(
        tiny_policy, "metaworld/push-v3", episodes=2, max_steps=16, num_envs=2, delay_ms=0, decode_ms=0, progress=False
    )
    assert zero["delay_steps"] == 0 and zero["returns"] == now["returns"] and zero["chunks"] == now["chunks"]
    # 100 ms at Meta-World's 80 Hz is 8 control steps; a synchronous robot holds 8 steps after each of its 4-action
    # chunks: 16 steps are 4 run, 8 held, 4 run.
    late = evaluate.evaluate(
        tiny_policy,
        "metaworld/push-v3",
        episodes=2,
        max_steps=16,
        num_envs=2,
        delay_ms=100,
        decode_ms=0,
        out_dir=tmp_path,
        progress=False,
    )
    saved = json.loads((tmp_path / "eval_info.json").read_text())
    assert saved["delay_steps"] == 8 and saved["request"] == "when empty" and saved["held_steps_mean"] == 8
    assert late["provenance"]["config"]["eval"]["delay_ms"] == 100
    measured = evaluate.evaluate(
        tiny_policy, "metaworld/push-v3", episodes=1, max_steps=8, delay_ms=50, ahead=True, progress=False
    )
    assert measured["decode_ms"] > 0 and measured["delay_steps"] == math.ceil((50 + measured["decode_ms"]) * 80 / 1000)
    with pytest.raises(ValueError, match="give --delay-ms too"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, ahead=True, progress=False)
    with pytest.raises(ValueError, match="--delay-ms must be a time in milliseconds"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, delay_ms=-5, progress=False)


def test_evaluation_asking_every_decode_keeps_several_replies_on_their_way(tiny_policy):
    # 12.5 ms of decode at 80 Hz is 1 control step (no network). Asked ahead with one reply on its way, a 4-action
    # chunk is asked for when 1 action remains and lands with its first skipped: a chunk every 3 steps, 6 in 16.
    # Asked every decode (1 step): a chunk every step, 16, each landing 1 step after its observation, never a hold.
    common = dict(episodes=1, max_steps=16, delay_ms=0, decode_ms=12.5, ahead=True, progress=False)
    one = evaluate.evaluate(tiny_policy, "metaworld/push-v3", **common)
    several = evaluate.evaluate(tiny_policy, "metaworld/push-v3", every="decode", **common)
    assert one["chunks"] == 6 and several["chunks"] == 16 and several["held_steps_mean"] == 0
    assert several["every"] == 1 and several["request"] == "ahead, every 1 step"
    assert several["provenance"]["config"]["eval"]["every"] == "decode"
    with pytest.raises(ValueError, match="it needs --ahead"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", episodes=1, delay_ms=0, every=2, progress=False)
    with pytest.raises(ValueError, match="--commit with --every"):
        evaluate.evaluate(tiny_policy, "metaworld/push-v3", 1, delay_ms=0, ahead=True, every=2, commit=True)
    assert evaluate._every("decode") == "decode" and evaluate._every("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="'decode'"):
        evaluate._every("0")


def test_evaluation_given_a_training_runs_folder_names_the_policy_inside_it(tiny_policy, capsys):
    from pathlib import Path

    from vla.cli import main

    run = Path(tiny_policy).parent
    before = sorted(p.name for p in run.iterdir())
    assert main(["eval", "--policy", str(run), "--episodes", "1"]) != 0
    assert (
        f"is a training run's folder, not a policy; did you mean --policy {run / 'policy'}?" in capsys.readouterr().err
    )
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written beside the run


def test_committed_prefix_decoding_begins_each_chunk_with_the_actions_that_run_meanwhile(
    tiny_dataset_root, tiny_policy, tmp_path
):
    """A binning policy given the actions that will run before its chunk arrives returns a chunk that begins with
    them (within half a bin, in raw units), and ``vla eval --ahead --commit`` sends them with every request; a policy
    whose ids mix the chunk's steps (FAST) with ``commit_search`` 0 is refused before any episode."""
    from tests.conftest import train_micro_policy
    from vla.execution import COMMITTED
    from vla.policy import VLAPolicy
    from vla.sim import make_env
    from vla.tokenizer_choice import tokenizer_config

    path = train_micro_policy(tiny_dataset_root, tmp_path / "bin", tokenizer_config("bin", n_bins=64))
    policy = VLAPolicy.from_pretrained(path).eval()
    normalizer = policy.action_normalizer
    committed = normalizer.unnormalize(np.random.default_rng(0).uniform(-0.8, 0.8, (2, 4)))  # raw [d = 2, D]
    with make_env("metaworld/push-v3") as env:
        obs = env.reset(evaluate.EVAL_SEED_START)
    runner = evaluate.ChunkPolicy(policy)
    chunk = runner([{**obs, COMMITTED: committed}, obs])  # the second row commits nothing
    half_bin = np.abs(normalizer.scale) / 64 + 1e-6
    assert np.all(np.abs(chunk[0, :2] - committed) <= half_bin)
    assert not np.all(np.abs(chunk[1, :2] - committed) <= half_bin)
    report = evaluate.evaluate(
        path,
        "metaworld/push-v3",
        episodes=2,
        max_steps=12,
        delay_ms=25,
        decode_ms=0,
        ahead=True,
        commit=True,
        num_envs=2,
        progress=False,
    )
    assert report["request"] == "ahead, with the committed actions" and report["delay_steps"] == 2
    assert report["valid_chunk_rate"] == 1.0 and report["provenance"]["config"]["eval"]["commit"] is True
    refusing = VLAPolicy.from_pretrained(tiny_policy)
    refusing.config.commit_search = 0
    with pytest.raises(ValueError, match="ids mix the chunk's steps"):
        evaluate.evaluate(
            refusing, "metaworld/push-v3", episodes=1, delay_ms=25, ahead=True, commit=True, progress=False
        )
    with pytest.raises(ValueError, match="it needs --ahead"):
        evaluate.evaluate(path, "metaworld/push-v3", episodes=1, delay_ms=25, commit=True, progress=False)


def test_a_fast_policy_keeps_the_decoded_chunk_nearest_the_committed_actions(tiny_dataset_root, tiny_policy):
    """FAST's ids mix the chunk's steps, so committed actions cannot be forced: the policy decodes the greedy chunk and
    ``commit_search - 1`` samples and keeps, per row, the one whose first actions are nearest them. Its first actions
    are then at least as near as the greedy chunk's, nearer when a sample beats it, the same for a row that commits
    nothing; the samples are one more decode (its steps add up); the same batch gives the same chunks."""
    from vla.execution import COMMITTED
    from vla.policy import VLAPolicy
    from vla.policy.commit_search import nearest_to_committed
    from vla.sim import make_env

    policy = VLAPolicy.from_pretrained(tiny_policy).eval()
    with make_env("metaworld/push-v3") as env:
        obs = env.reset(evaluate.EVAL_SEED_START)
    runner = evaluate.ChunkPolicy(policy)
    greedy = runner([obs, obs])
    greedy_steps = policy.last_decode_info.steps
    far = greedy[0, :2] + 3.0 * np.abs(policy.action_normalizer.scale)  # committed actions unlike the greedy chunk's
    chunk = runner([{**obs, COMMITTED: far}, {**obs, COMMITTED: np.zeros((0, 4))}])
    assert policy.last_decode_info.steps > greedy_steps  # the samples: one more decode, of B * 7 rows
    scale = np.abs(policy.action_normalizer.scale)

    def error(c):
        return float(np.mean(((c[:2] - far) / scale) ** 2))

    assert error(chunk[0]) < error(greedy[0])  # a sample nearer than the greedy chunk was found
    np.testing.assert_allclose(chunk[1], greedy[1], atol=1e-5)  # nothing committed: the greedy chunk
    with pytest.raises(ValueError, match=r"send float \[d, 4\]"):
        runner([{**obs, COMMITTED: np.zeros((2, 3))}])
    with pytest.raises(ValueError, match="not all finite"):
        runner([{**obs, COMMITTED: np.full((1, 4), np.nan)}])
    again = runner([{**obs, COMMITTED: far}, {**obs, COMMITTED: np.zeros((0, 4))}])
    np.testing.assert_array_equal(again, chunk)  # seeded: the same batch, the same search

    candidates = [np.zeros((2, 3, 1)), np.ones((2, 3, 1)), np.full((2, 3, 1), 2.0)]
    valid = [np.array([True, True]), np.array([False, True]), np.array([True, True])]
    picked = nearest_to_committed(candidates, valid, [np.ones((2, 1)), np.full((1, 1), 1.9)], np.ones(1))
    assert picked.tolist() == [0, 2]  # row 0: the nearest valid (1 is invalid there; 0 and 2 tie, the first kept)
