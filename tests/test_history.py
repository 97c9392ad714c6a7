"""A state history (``VLAConfig.n_obs_steps``): the last n states, oldest first, from the data, in the rollout loop and
in ``select_action``, the same frames everywhere (an episode's first frame repeated until there are n)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from lerobot.utils.constants import OBS_STATE

from vla import train
from vla.config import TrainConfig
from vla.data import columns, reader
from vla.data.torch_dataset import ActionChunkDataset
from vla.evaluate import evaluate
from vla.policy import VLAConfig, VLAPolicy
from vla.sim.rollout import run_episodes
from vla.tokenizer_choice import tokenizer_config

N = 3


def test_both_backends_give_the_last_n_states_with_the_first_repeated(tiny_dataset_root):
    info = reader.dataset_info(tiny_dataset_root)
    frames = reader._read_frames(info, info.episode_index.tolist(), [OBS_STATE])
    memory = ActionChunkDataset(info, 4, backend="memory", obs_steps=N)
    lerobot = ActionChunkDataset(info, 4, backend="lerobot", obs_steps=N)
    second_episode = int(info.episode_lengths[0])
    for i in (0, 1, 2, 5, second_episode, second_episode + 1):
        m, r = memory[i][OBS_STATE], lerobot[i][OBS_STATE]
        assert m.shape == (N, info.state_dim)
        torch.testing.assert_close(m, r)
        start = int(frames["episode_start"][i])
        rows = [max(start, i - k) for k in (2, 1, 0)]  # oldest first, never into the previous episode
        np.testing.assert_allclose(m.numpy(), frames[OBS_STATE][rows].astype(np.float32))
    assert ActionChunkDataset(info, 4, backend="memory")[5][OBS_STATE].shape == (info.state_dim,)  # n = 1: [S]


@pytest.fixture(scope="module")
def history_policy(tiny_dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("history")
    cfg = TrainConfig(
        dataset_root=str(tiny_dataset_root),
        output_dir=str(out),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        policy=VLAConfig(
            preset="micro",
            time_horizon=4,
            n_action_steps=2,
            n_obs_steps=N,
            scheduler_warmup_steps=1,
            scheduler_decay_steps=4,
            device="cpu",
        ),
        steps=4,
        batch_size=4,
        save_every=4,
        log_every=1,
        heldout_episodes=0.25,
        eval_every=2,
        eval_chunks=8,
        report_chunks=8,
        progress=False,
    )
    result = train.main(cfg)
    return VLAPolicy.from_pretrained(result["policy_path"]).eval(), out


def test_a_history_policy_trains_reports_and_reloads(history_policy):
    policy, out = history_policy
    assert policy.config.n_obs_steps == N and policy.config.observation_delta_indices == [-2, -1, 0]
    assert policy.model.state_encoder.state_dim == N * policy.config.state_dim  # the frames side by side
    assert (out / "offline_report.json").is_file()  # the held-out report ran on histories


def test_predict_needs_the_history_and_select_action_keeps_it(history_policy):
    policy, _ = history_policy
    s = policy.config.state_dim
    g = torch.Generator().manual_seed(0)
    states = torch.randn(5, 2, s, generator=g)  # five steps of two episodes
    with pytest.raises(ValueError, match=rf"last {N} frames.*\[B, {N}, {s}\]"):
        policy.predict_action_chunk({OBS_STATE: states[0], "task": ["push", "push"]})
    history = torch.stack([states[0], states[0], states[1]], dim=1)  # [B, n, S] after two steps
    expected = policy.predict_action_chunk({OBS_STATE: history, "task": ["push", "push"]})
    policy.config.n_action_steps = 1  # a chunk every call: the second call's chunk is the one above
    policy.reset()
    policy.select_action({OBS_STATE: states[0], "task": ["push", "push"]})
    second = policy.select_action({OBS_STATE: states[1], "task": ["push", "push"]})
    torch.testing.assert_close(second, expected[:, 0])
    assert len(policy._history.frames) == N
    policy.reset()
    assert len(policy._history.frames) == 0
    policy.config.n_action_steps = 2


def test_rollouts_show_the_policy_the_history(history_policy):
    class Line:  # the state counts steps
        name, action_dim, max_steps = "line/count", 1, 5

        def reset(self, seed):
            self.t = 0
            return {OBS_STATE: np.array([0.0]), "task": "count"}

        def step(self, action, render=True):
            self.t += 1
            return {OBS_STATE: np.array([float(self.t)]), "task": "count"}, 0.0, self.t >= 5, {"success": False}

        def close(self):
            pass

    seen = []

    def policy(observations):
        seen.append(observations[0][OBS_STATE].copy())
        return np.zeros((1, 1, 1))

    run_episodes([Line()], policy, [0], n_action_steps=1, obs_steps=N)
    assert [s[:, 0].tolist() for s in seen[:4]] == [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]


def test_closed_loop_evaluation_of_a_history_policy(history_policy):
    policy, _ = history_policy
    report = evaluate(policy, "metaworld/push-v3", 2, max_steps=12, num_envs=2, progress=False)
    assert report["episodes"] == 2 and report["valid_chunk_rate"] == 1.0 and all(n == 12 for n in report["lengths"])


def test_bad_n_obs_steps_is_refused():
    with pytest.raises(ValueError, match="n_obs_steps"):
        VLAConfig(n_obs_steps=0, device="cpu")


def test_the_prefix_reads_the_current_state_and_its_scaled_changes(history_policy, tiny_dataset_root):
    policy, _ = history_policy
    scale = np.asarray(policy.config.state_delta_scale)
    assert scale.shape == (policy.config.state_dim,) and (scale > 0).all()
    # vla train's fit (on the training episodes): one frame's normalised change, times the scale, has its 99th
    # percentile at 1 per moving dim (all episodes here: close to 1)
    changes = columns.state_changes(tiny_dataset_root) / policy.state_normalizer.scale * scale
    q99 = np.quantile(np.abs(changes), 0.99, axis=0)
    assert (q99 > 0).sum() > 10 and (np.abs(q99[q99 > 0] - 1) < 0.25).all(), q99
    from vla.policy.pipeline import EncodeHistory

    s = policy.config.state_dim
    history = np.stack([np.full((2, s), 1.0), np.full((2, s), 3.0), np.full((2, s), 4.0)], axis=1)  # [B, 3, S]
    out = EncodeHistory(tuple(scale))({OBS_STATE: history})[OBS_STATE]
    assert out.shape == (2, 3 * s)
    np.testing.assert_allclose(out[0, :s], 4.0)  # the current frame
    np.testing.assert_allclose(out[0, s : 2 * s], 1.0 * scale)  # since the previous frame
    np.testing.assert_allclose(out[0, 2 * s :], 3.0 * scale)  # since the oldest
    with pytest.raises(ValueError, match="state_delta_scale has 2 values"):
        VLAPolicy(
            dataclasses.replace(policy.config, state_delta_scale=[1.0, 2.0]),
            action_tokenizer=policy.action_tokenizer,
            action_normalizer=policy.action_normalizer,
            state_normalizer=policy.state_normalizer,
        )
