"""Held-out measurement and relative actions, on a tiny joint-space dataset made here (names that match by name,
a gripper) where every expected number can be computed from the arrays that made it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import assert_plot
from vla import train
from vla.config import TrainConfig, resolve_action_state
from vla.data import columns, reader
from vla.heldout import Heldout
from vla.policy import VLAConfig, VLAPolicy
from vla.policy.pipeline import AbsoluteActions, RelativeActions, run
from vla.tokenizer_choice import tokenizer_config

EPISODES, FRAMES, T = 6, 16, 4
ACTION_NAMES = ["j1.pos", "j2.pos", "gripper.pos"]
STATE_NAMES = ["j2.pos", "speed", "j1.pos", "gripper.pos"]  # other order, one extra: matched by name


def arm(episode: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode: joints sweeping from an episode-dependent start, a gripper that closes halfway; the action is
    the next frame's joints (a commanded position leads the measured one), the state holds them by name."""
    k = np.arange(FRAMES, dtype=np.float64)
    j1, j2 = 10.0 * episode + 2.0 * k, -5.0 * episode + np.sin(k / 3.0) * 4.0
    grip = np.where(k < FRAMES / 2, 80.0, 5.0 + episode)
    state = np.stack([j2, np.full_like(k, 0.5 * episode), j1, grip], 1)
    action = np.stack([np.append(j1[1:], j1[-1]), np.append(j2[1:], j2[-1]), grip], 1)
    return action.astype(np.float32), state.astype(np.float32)


@pytest.fixture(scope="module")
def arm_root(tmp_path_factory) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("arm") / "ds"
    features = {
        "observation.state": {"dtype": "float32", "shape": (4,), "names": STATE_NAMES},
        "action": {"dtype": "float32", "shape": (3,), "names": ACTION_NAMES},
    }
    ds = LeRobotDataset.create("local/arm", fps=10, features=features, root=root, use_videos=False)
    for episode in range(EPISODES):
        action, state = arm(episode)
        for a, s in zip(action, state):
            ds.add_frame({"observation.state": s, "action": a, "task": "pick the grape"})
        ds.save_episode()
    ds.finalize()
    return root


def resolved(root: Path, **policy) -> VLAConfig:
    info = reader.dataset_info(root)
    return resolve_action_state(
        VLAConfig(preset="micro", time_horizon=T, n_action_steps=2, device="cpu", **policy), info
    )


def test_state_dims_are_matched_by_name_and_auto_keeps_grippers_absolute(arm_root):
    config = resolved(arm_root, relative_actions="auto")
    assert config.action_state_dims == [2, 0, 3]
    assert config.relative_actions == [True, True, False] and config.relative_mask() == (True, True, False)
    assert resolved(arm_root).relative_mask() is None  # "none": all absolute


def test_relative_then_absolute_gives_the_chunk_back_and_leaves_grippers_alone():
    rng = np.random.default_rng(0)
    chunks, state = rng.normal(size=(5, T, 3)) * 50, rng.normal(size=(5, 4)) * 50
    mask, dims = (True, True, False), (2, 0, 3)
    relative = RelativeActions(mask, dims)({"action": chunks, "observation.state": state})
    np.testing.assert_array_equal(relative["action"][..., 2], chunks[..., 2])  # the gripper stays absolute
    np.testing.assert_allclose(relative["action"][..., 0], chunks[..., 0] - state[:, None, 2])
    np.testing.assert_allclose(relative["action"][..., 1], chunks[..., 1] - state[:, None, 0])
    back = AbsoluteActions(mask, dims)(relative)
    np.testing.assert_allclose(back["action"], chunks, atol=1e-9)
    with pytest.raises(ValueError, match="raw batch\\['observation.state'\\]"):
        AbsoluteActions(mask, dims)({"action": chunks})


def test_baselines_are_the_mean_action_and_the_held_state(arm_root):
    """Both baselines against errors computed by hand from the arrays that made the dataset (every held-out chunk)."""
    info = reader.dataset_info(arm_root)
    train_eps, heldout_eps = [0, 1, 2, 3], [4, 5]
    heldout = Heldout.build(info, heldout_eps, train_eps, resolved(arm_root), n_chunks=10_000)
    frames = np.concatenate([arm(e)[0] for e in train_eps]).astype(np.float64)
    mean = frames.mean(0)
    scale = (np.quantile(frames, 0.99, axis=0) - np.quantile(frames, 0.01, axis=0)) / 2
    sq_mean, sq_hold, n = np.zeros(3), np.zeros(3), 0
    for e in heldout_eps:
        action, state = arm(e)
        for start in range(FRAMES):
            for k in range(T):
                if start + k >= FRAMES:  # padding past the episode's end is not scored
                    continue
                sq_mean += (action[start + k] - mean) ** 2
                sq_hold += (action[start + k] - state[start][[2, 0, 3]]) ** 2
                n += 1
    assert len(heldout) == len(heldout_eps) * FRAMES
    got_mean, got_hold = heldout.baselines["mean_action"], heldout.baselines["hold_state"]
    np.testing.assert_allclose(got_mean["rmse_raw_per_dim"], np.sqrt(sq_mean / n), rtol=1e-6)
    np.testing.assert_allclose(got_hold["rmse_raw_per_dim"], np.sqrt(sq_hold / n), rtol=1e-6)
    np.testing.assert_allclose(got_hold["rmse_per_dim"], np.sqrt(sq_hold / n) / scale, rtol=1e-6)
    assert got_mean["rmse"] == pytest.approx(float(np.mean(np.sqrt(sq_mean / n) / scale)), rel=1e-6)


def test_hold_state_is_not_defined_when_the_state_does_not_match(arm_root):
    info = reader.dataset_info(arm_root)
    unmatched = VLAConfig(preset="micro", time_horizon=T, n_action_steps=2, device="cpu")  # dims left unresolved
    heldout = Heldout.build(info, [5], [0, 1], unmatched, n_chunks=8)
    assert heldout.baselines["hold_state"] is None and "action_state_dims" in heldout.why_no_hold
    assert len(heldout) == 8


def test_relative_training_predicts_absolute_chunks_and_reports(arm_root, tmp_path):
    cfg = TrainConfig(
        dataset_root=str(arm_root),
        output_dir=str(tmp_path),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        policy=VLAConfig(
            preset="micro",
            time_horizon=T,
            n_action_steps=2,
            scheduler_warmup_steps=1,
            scheduler_decay_steps=4,
            device="cpu",
            relative_actions="auto",
        ),
        heldout_episodes=0.34,
        steps=4,
        batch_size=4,
        save_every=100,
        log_every=1,
        eval_every=2,
        eval_chunks=8,
        report_chunks=16,
        progress=False,
    )
    summary = train.main(cfg)
    policy = VLAPolicy.from_pretrained(summary["policy_path"])
    assert policy.config.relative_actions == [True, True, False] and policy.config.action_state_dims == [2, 0, 3]

    # the normaliser was fitted on what the model predicts: the training chunks relative to their first state
    train_eps = json.loads((tmp_path / "heldout.json").read_text())["train_episodes"]
    info = reader.dataset_info(arm_root)
    chunks, _ = columns.action_chunks(info, T, episodes=train_eps)
    states = columns.chunk_states(info, episodes=train_eps)
    rel = chunks - states[:, None, [2, 0, 3]] * np.array([1.0, 1.0, 0.0])
    flat = rel.reshape(-1, 3).astype(np.float64)
    lo, hi = np.quantile(flat, 0.01, axis=0), np.quantile(flat, 0.99, axis=0)
    np.testing.assert_allclose(policy.action_normalizer.offset, (hi + lo) / 2, rtol=1e-5, atol=1e-5)

    # the same ids decoded for two states differ by exactly the state's change on the relative dims
    ids = policy.action_tokenizer.encode(np.zeros((1, T, 3)))
    s1 = np.array([[1.0, 0.0, 2.0, 3.0]])
    s2 = s1 + np.array([[10.0, 7.0, -20.0, 30.0]])
    a1 = run(policy.pipeline.outputs, {"action_ids": ids, "observation.state": s1})["action"]
    a2 = run(policy.pipeline.outputs, {"action_ids": ids, "observation.state": s2})["action"]
    np.testing.assert_allclose(a2 - a1, np.broadcast_to([-20.0, 10.0, 0.0], a1.shape), atol=1e-9)

    # predict_action_chunk goes through it: the decoded chunk follows the state it is given
    obs = {"observation.state": torch.tensor(s1, dtype=torch.float32), "task": ["pick the grape"]}
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (1, T, 3) and torch.isfinite(chunk).all()

    # metrics.jsonl carries the held-out rows at the eval steps, and the offline report is written
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in rows if "heldout_rmse" in r]
    assert evals == [2, 4]
    last = rows[-1]
    assert 0 <= last["heldout_accuracy"] <= 1 and last["heldout_valid_rate"] == 1.0
    assert len(last["heldout_rmse_per_dim"]) == 3 and last["heldout_hold_state_rmse"] is not None
    report = json.loads((tmp_path / "offline_report.json").read_text())
    assert report["n_chunks"] == 16 and report["heldout_episodes"] == summary["heldout_episodes"]
    assert report["beats_mean_action"] == (report["policy"]["rmse"] < report["baselines"]["mean_action"]["rmse"])
    assert (tmp_path / "offline_report.md").read_text().startswith("#")
    for name in ("offline_report.png", "heldout.png"):
        assert_plot(tmp_path / name)


def test_relative_actions_with_an_absolute_pretrained_tokenizer_is_refused(arm_root, tmp_path):
    from vla.fit import fit_tokenizer

    fit_tokenizer(arm_root, tmp_path / "tok", "fast:vocab_size=256", time_horizon=T, log=lambda *_: None)
    cfg = TrainConfig(
        dataset_root=str(arm_root),
        output_dir=str(tmp_path / "run"),
        tokenizer=tokenizer_config("fast", vocab_size=256, pretrained_path=str(tmp_path / "tok")),
        policy=VLAConfig(preset="micro", time_horizon=T, n_action_steps=2, device="cpu", relative_actions="auto"),
        steps=1,
        progress=False,
    )
    with pytest.raises(ValueError, match="fitted on absolute actions"):
        train.main(cfg)


def test_bad_relative_settings_say_what_to_do():
    with pytest.raises(ValueError, match="relative_actions"):
        VLAConfig(relative_actions="deltas")
    with pytest.raises(ValueError, match="one entry per action dimension"):
        VLAConfig(action_dim=3, relative_actions=[True, False])
    with pytest.raises(ValueError, match="action_state_dims"):
        VLAConfig(action_dim=2, relative_actions=[True, False]).relative_mask()


def test_heldout_measurement_with_a_camera(tiny_image_dataset_root, tmp_path):
    """Cameras travel with the held-out observations into decoding and the teacher-forced loss."""
    cfg = TrainConfig(
        dataset_root=str(tiny_image_dataset_root),
        output_dir=str(tmp_path),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        policy=VLAConfig(
            preset="micro",
            time_horizon=T,
            n_action_steps=2,
            scheduler_warmup_steps=1,
            scheduler_decay_steps=2,
            device="cpu",
            image_keys=["observation.images.corner2"],
        ),
        heldout_episodes=0.5,
        steps=2,
        batch_size=2,
        save_every=100,
        log_every=1,
        eval_every=2,
        eval_chunks=4,
        report_chunks=4,
        progress=False,
    )
    train.main(cfg)
    report = json.loads((tmp_path / "offline_report.json").read_text())
    assert report["n_chunks"] == 4 and np.isfinite(report["policy"]["loss"]) and report["policy"]["valid_rate"] == 1.0
