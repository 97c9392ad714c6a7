"""vla.sim.aloha_env / aloha_expert: the ALOHA env's contract (shapes, seeds, actions, cameras), its scripted
expert replayed through the rollout loop, and a recording into a LeRobot dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_plot
from vla.sim import EVAL_SEED_START, make_env, make_expert, split_name
from vla.sim.aloha_env import (
    JOINT_NAMES,
    TASKS,
    assets_dir,
    normalize_gripper,
    sample_objects,
    unnormalize_gripper,
)
from vla.sim.rollout import run_episode

CUBE, INSERTION = "aloha/transfer-cube", "aloha/insertion"
TOP = "observation.images.top"


def test_family_tasks_and_unknown_names():
    fam, task = split_name(CUBE)
    assert fam.name == "aloha" and task == "transfer-cube" and set(fam.tasks()) == {"transfer-cube", "insertion"}
    assert fam.default_cameras == (TOP,)
    with make_env(CUBE) as env:
        assert (env.name, env.fps, env.action_dim, env.max_steps) == (CUBE, 50, 14, 400)
        assert env.task_text == "pick up the cube with the right arm and hand it to the left arm"
    with pytest.raises(ValueError, match="did you mean 'transfer-cube'"):
        make_env("aloha/transfer-cub")
    with pytest.raises(ValueError, match="unknown ALOHA observation convention 'lerobot'"):
        make_env(CUBE, observation="lerobot")


@pytest.mark.parametrize("name, state_dim", [(CUBE, 21), (INSERTION, 28)])
def test_observation_and_features(name, state_dim):
    with make_env(name) as env:
        obs = env.reset(0)
        features = env.features
    state = obs["observation.state"]
    assert state.shape == (state_dim,) and state.dtype == np.float32
    assert features["observation.state"]["shape"] == (state_dim,)
    assert len(features["observation.state"]["names"]) == state_dim
    assert features["action"] == {"dtype": "float32", "shape": (14,), "names": JOINT_NAMES}
    assert not any(ft["dtype"] == "image" for ft in features.values())
    assert obs["task"] == TASKS[name.split("/")[1]].text
    # At rest: grippers near their start opening, the objects exactly where the seed put them.
    assert 0.0 < state[6] < 0.2 and 0.0 < state[13] < 0.2
    np.testing.assert_allclose(state[14:], sample_objects(name.split("/")[1], 0), atol=1e-6)
    with make_env(name, observation="proprio") as env:
        assert env.reset(0)["observation.state"].shape == (14,)
        assert env.features["observation.state"]["names"] == JOINT_NAMES


def test_seeds_give_reproducible_distinct_poses_within_the_ranges():
    with make_env(INSERTION) as env:
        a, b, again = (env.reset(s)["observation.state"][14:] for s in (3, 4, 3))
    np.testing.assert_array_equal(a, again)
    assert not np.allclose(a[:3], b[:3]) and not np.allclose(a[7:10], b[7:10])  # peg and socket both move
    poses = np.stack([sample_objects("insertion", s) for s in range(200)])
    for k, ranges in enumerate(TASKS["insertion"].ranges):
        low, high = np.array(ranges).T
        assert np.all(poses[:, 7 * k : 7 * k + 3] >= low) and np.all(poses[:, 7 * k : 7 * k + 3] <= high)
    assert len({tuple(p) for p in poses.round(6)}) == 200


def test_step_contract_bad_actions_and_clipping():
    with make_env(CUBE, max_steps=3) as env:
        obs = env.reset(0)
        hold = obs["observation.state"][:14]
        with pytest.raises(ValueError, match="float \\[14\\]"):
            env.step(np.zeros(13))
        with pytest.raises(ValueError, match="non-finite"):
            env.step(np.where(np.arange(14) == 2, np.nan, hold))
        obs, reward, done, info = env.step(hold)
        assert env.clipped_steps == 0 and isinstance(reward, float) and reward == 0.0 and not done
        env.step(np.where(np.arange(14) == 6, 2.0, hold))  # the left gripper beyond open: clipped and counted
        assert env.clipped_steps == 1
        obs, reward, done, info = env.step(hold)
        assert done and info == {"success": False, "truncated": True}
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(hold)
    with pytest.raises(ValueError, match="non-negative"):
        make_env(CUBE).reset(-1)


def test_gripper_normalisation_round_trips():
    values = np.linspace(0, 1, 11)
    np.testing.assert_allclose(normalize_gripper(unnormalize_gripper(values)), values)
    assert unnormalize_gripper(0.0) < unnormalize_gripper(1.0)  # 0 closed, 1 open


def test_top_camera_renders_float_chw():
    with make_env(CUBE, image_keys=[TOP], image_size=32) as env:
        obs = env.reset(0)
        assert env.features[TOP]["dtype"] == "image" and env.features[TOP]["shape"] == (32, 32, 3)
        frame = env.last_frames[TOP]
        assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8
    image = obs[TOP]
    assert image.shape == (3, 32, 32) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.01
    np.testing.assert_allclose(image, frame.transpose(2, 0, 1) / 255.0, atol=1e-6)
    with pytest.raises(ValueError, match="unknown ALOHA camera 'topp'.*did you mean 'top'"):
        make_env(CUBE, image_keys=["observation.images.topp"])


@pytest.mark.parametrize("name, seed", [(CUBE, 0), (INSERTION, 1)])
def test_expert_succeeds_through_the_rollout_loop(name, seed):
    expert = make_expert(name)
    with make_env(name) as env:
        expert.reset(seed)
        first = expert.actions.copy()
        result = run_episode(env, expert, seed)
        assert result.success and 200 < result.length < 400 and env.clipped_steps == 0
        expert.reset(seed)  # the plan is a function of the seed
        np.testing.assert_array_equal(expert.actions, first)
        assert expert.actions.shape == (400, 14) and expert.actions.dtype == np.float32


def test_expert_refuses_another_seeds_layout():
    expert = make_expert(CUBE)
    with make_env(CUBE) as env:
        obs = env.reset(1)
        with pytest.raises(RuntimeError, match="call reset"):
            expert(obs)
        expert.reset(0)
        with pytest.raises(ValueError, match="same seed"):
            expert(obs)


def test_records_a_short_episode_with_the_camera(tmp_path):
    from vla.data.reader import dataset_info
    from vla.sim.record import record

    root = tmp_path / "aloha"
    summary = record(CUBE, 1, root, images=True, image_size=32, max_steps=12, keep_failed=True, progress=False)
    assert summary["episodes"] == 1 and summary["episode_lengths"] == [12] and summary["fps"] == 50
    info = dataset_info(root)
    assert info.fps == 50 and info.num_frames == 12 and info.action_dim == 14 and info.state_dim == 21
    assert info.camera_keys == [TOP] and info.action_names == JOINT_NAMES
    assert info.tasks == [TASKS["transfer-cube"].text] and info.robot_type == "aloha"
    with pytest.raises(ValueError, match="open loop.*--action-noise"):  # nothing would correct the noisy replay
        record(CUBE, 1, tmp_path / "noisy", action_noise=0.1, progress=False)
    assert not (tmp_path / "noisy").exists()


def test_missing_models_say_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gym_aloha" else real(name, *a))
    with pytest.raises(RuntimeError, match="make setup"):
        assets_dir()


def test_the_closed_loop_table_reads_every_listed_run(tmp_path):
    """scripts/aloha_table.py on the committed results: one row per run in runs.json, each figure from its evaluation."""
    repo = Path(__file__).parents[1]
    runs = json.loads((repo / "results/aloha/runs.json").read_text())["runs"]
    done = subprocess.run(
        [
            sys.executable,
            str(repo / "scripts/aloha_table.py"),
            "--out",
            str(tmp_path),
            "--runs",
            str(repo / "results/aloha/runs.json"),
        ],
        capture_output=True,
        text=True,
        cwd=repo,
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line
        for line in (tmp_path / "closed_loop.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| task") and not line.startswith("| ---")
    ]
    assert len(rows) == len(runs)
    for run, row in zip(runs, rows):
        info = run["evaluation"]
        assert row.startswith(f"| {info['env'].split('/')[1]} | {run['tokenizer']}")
        assert f" | {run['demos']} | {run['steps']:,} | " in row
        seeds = "" if info["seed_start"] == EVAL_SEED_START else f" from seed {info['seed_start']:,}"
        assert row.endswith(f"| {info['success_rate']:.1%} ({info['episodes']} ep{seeds}) |")
    assert_plot(tmp_path / "closed_loop.png")
