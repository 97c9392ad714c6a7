"""The toy/obstacle environment and its two-way expert (vla.sim.toy_env), and the regression baseline (vla.regression)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla.sim import EVAL_SEED_START, TRAIN_SEED_START, make_env, make_expert, toy_env
from vla.sim.rollout import run_episode

ENV = "toy/obstacle"


def expert_episode(seed: int):
    env, expert = make_env(ENV), make_expert(ENV)
    expert.reset(seed)
    positions = []
    result = run_episode(env, expert, seed, on_step=lambda obs, action: positions.append(obs["observation.state"][:2]))
    positions.append(env.position.copy())
    return result, np.asarray(positions), expert.side_name


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    from vla.sim.record import record

    root = tmp_path_factory.mktemp("toy") / "obstacle"
    record(ENV, 6, root, progress=False)
    return root


def test_expert_goes_both_ways_and_always_succeeds():
    sides = []
    for seed in list(range(TRAIN_SEED_START, TRAIN_SEED_START + 30)) + list(
        range(EVAL_SEED_START, EVAL_SEED_START + 10)
    ):
        result, positions, side = expert_episode(seed)
        assert result.success and result.ret == 1.0, seed
        assert toy_env.side_of(positions) == side  # the trajectory passes the disc on the side the expert chose
        sides.append(side)
    assert 8 <= sides.count("left") <= 32 and sides.count("left") + sides.count("right") == 40


def test_seeds_reproduce_layout_side_and_trajectory():
    a, b = expert_episode(7), expert_episode(7)
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]
    env = make_env(ENV)
    starts = {tuple(env.reset(seed)["observation.state"]) for seed in range(5)}
    assert len(starts) == 5  # distinct seeds, distinct layouts
    obs = env.reset(3)
    assert obs["observation.state"].dtype == np.float32 and obs["observation.state"].shape == (2,)
    assert obs["task"] == env.task_text and env.last_frames == {}
    assert set(env.features) == {"observation.state", "action"}


def test_collision_ends_the_episode_on_the_disc():
    env = make_env(ENV)
    env.reset(0)
    for k in range(env.max_steps):  # straight up, into the disc
        _, reward, done, info = env.step([0.0, 1.0])
        if done:
            break
    assert info["collision"] and not info["success"] and reward == -1.0 and k < 15
    assert np.linalg.norm(env.position - np.asarray(toy_env.OBSTACLE_CENTER)) == pytest.approx(toy_env.OBSTACLE_RADIUS)
    with pytest.raises(RuntimeError, match="reset"):
        env.step([0.0, 1.0])


def test_a_segment_through_the_disc_collides_even_when_both_ends_are_outside():
    assert toy_env.segment_hits_disc([-0.5, 0.0], [0.5, 0.0]) == pytest.approx(0.2)
    assert toy_env.segment_hits_disc([-0.5, 0.5], [0.5, 0.5]) is None
    assert toy_env.segment_hits_disc([0.0, -0.5], [0.0, -0.35]) is None  # stops short


def test_standing_still_stalls_until_max_steps():
    env = make_env(ENV, max_steps=12)
    env.reset(1)
    for _ in range(12):
        _, reward, done, info = env.step([0.0, 0.0])
    assert done and info["truncated"] and not info["collision"] and reward == 0.0


def test_bad_actions_and_cameras_are_refused():
    env = make_env(ENV)
    env.reset(0)
    with pytest.raises(ValueError, match="float \\[2\\]"):
        env.step([0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        env.step([np.nan, 0.0])
    with pytest.raises(ValueError, match="state only"):
        make_env(ENV, image_keys=["observation.images.top"])


def test_recording_holds_both_modes(toy_root):
    from vla.data import columns, reader

    info = reader.dataset_info(toy_root)
    assert (info.state_dim, info.action_dim, info.fps) == (2, 2, toy_env.FPS)
    states = columns.chunk_states(info)
    bounds = np.cumsum([0, *info.episode_lengths.tolist()])
    recorded = [toy_env.side_of(states[s:e, :2]) for s, e in zip(bounds[:-1], bounds[1:])]
    expected = [expert_episode(seed)[2] for seed in range(6)]  # seeds 0..5, all successes
    assert recorded == expected


def test_hidden_for_matches_the_parameter_count():
    import action_tokenizers as at

    from vla.regression import RegressionConfig, RegressionPolicy, hidden_for

    for target in (50_000, 1_000_000):
        config = RegressionConfig(4, 2, hidden=hidden_for(target, 4, 2, 10))
        policy = RegressionPolicy(config, at.Normalizer.identity(2), at.Normalizer.identity(4))
        assert sum(p.numel() for p in policy.parameters()) == config.parameters()
        assert abs(config.parameters() - target) / target < 0.01


def test_regression_fits_a_small_batch():
    import action_tokenizers as at

    from vla.regression import RegressionConfig, RegressionPolicy

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    batch = {
        "observation.state": rng.uniform(-1, 1, (16, 4)).astype(np.float32),
        "action": rng.uniform(-1, 1, (16, 10, 2)).astype(np.float32),
        "action_is_pad": np.zeros((16, 10), bool),
    }
    policy = RegressionPolicy(RegressionConfig(4, 2, hidden=64), at.Normalizer.identity(2), at.Normalizer.identity(4))
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss, _ = policy.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


def test_regression_trains_on_a_recording_and_round_trips(toy_root, tmp_path):
    from vla.regression import RegressionConfig, RegressionPolicy, train_regression

    config = RegressionConfig(2, 2, hidden=32, layers=2)
    policy, losses = train_regression(toy_root, config, steps=80, batch_size=16, progress=False)
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:5])  # the two-way demonstrations keep a floor above 0
    policy.save_pretrained(tmp_path / "reg")
    assert {p.name for p in (tmp_path / "reg").iterdir()} == {"config.json", "model.safetensors"}
    again = RegressionPolicy.from_pretrained(tmp_path / "reg")
    states = np.random.default_rng(0).uniform(-1, 1, (5, 2)).astype(np.float32)
    chunk = policy.predict_action_chunk({"observation.state": states})
    assert chunk.shape == (5, 10, 2)
    torch.testing.assert_close(again.predict_action_chunk({"observation.state": states}), chunk)
    with pytest.raises(ValueError, match="no regression policy"):
        RegressionPolicy.from_pretrained(tmp_path / "missing")
