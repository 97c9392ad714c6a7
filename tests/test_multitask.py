"""Instructions that matter: one policy, two tasks whose observations are the same and whose actions are opposite.
Only the words of the instruction can tell the policy which to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vla import train
from vla.config import TrainConfig
from vla.policy import VLAConfig, VLAPolicy
from vla.tokenizer_choice import tokenizer_config

TASKS = {"slide the block to the left": -0.8, "slide the block to the right": 0.8}
STATE = np.array([0.1, -0.2, 0.3], dtype=np.float32)


@pytest.fixture(scope="module")
def two_task_root(tmp_path_factory) -> Path:
    """Episodes of both tasks from the same state; action dim 0 is the task's direction, dim 1 is noise."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("two_tasks") / "ds"
    features = {
        "observation.state": {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["dx", "dy"]},
    }
    ds = LeRobotDataset.create("local/two_tasks", fps=10, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(0)
    for episode in range(8):
        task = list(TASKS)[episode % 2]
        for _ in range(12):
            action = np.array([TASKS[task], 0.0], dtype=np.float32) + rng.normal(0, 0.05, 2).astype(np.float32)
            ds.add_frame({"observation.state": STATE, "action": action, "task": task})
        ds.save_episode()
    ds.finalize()
    return root


def test_the_same_observation_gets_the_action_its_instruction_asks_for(two_task_root, tmp_path, one_torch_thread):
    cfg = TrainConfig(
        dataset_root=str(two_task_root),
        output_dir=str(tmp_path),
        tokenizer=tokenizer_config("bin", n_bins=32),
        policy=VLAConfig(
            preset="micro",
            time_horizon=2,
            n_action_steps=2,
            scheduler_warmup_steps=5,
            scheduler_decay_steps=400,
            device="cpu",
        ),
        steps=400,
        batch_size=16,
        save_every=400,
        log_every=100,
        heldout_episodes=0,
        progress=False,
    )
    policy = VLAPolicy.from_pretrained(train.main(cfg)["policy_path"]).eval()
    assert set(policy.config.text_words) >= {" left", " right"}  # the instructions' words, one id each
    batch = {"observation.state": torch.as_tensor(np.stack([STATE, STATE])), "task": list(TASKS)}
    with torch.inference_mode():
        chunks = policy.predict_action_chunk(batch).numpy()  # [2, T, 2]
    left, right = chunks[0, :, 0], chunks[1, :, 0]
    assert np.all(left < -0.5) and np.all(right > 0.5), chunks


def test_balance_tasks_draws_each_task_equally_often(tmp_path):
    """One task with three times the other's frames: balanced sampling draws each about half the time."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from vla.data.torch_dataset import ActionChunkDataset

    root = tmp_path / "unbalanced"
    features = {
        "observation.state": {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["dx", "dy"]},
    }
    ds = LeRobotDataset.create("local/unbalanced", fps=10, features=features, root=root, use_videos=False)
    for episode in range(8):
        task = list(TASKS)[int(episode >= 2)]  # 2 episodes to the left, 6 to the right
        for _ in range(12):
            ds.add_frame({"observation.state": STATE, "action": np.array([TASKS[task], 0.0], np.float32), "task": task})
        ds.save_episode()
    ds.finalize()
    dataset = ActionChunkDataset(root, 2, episodes=[0, 1, 2, 3, 5, 6, 7], backend="memory")  # 2 left, 5 right
    weights = train.task_weights(dataset)
    left = np.array([dataset[i]["task"] == "slide the block to the left" for i in range(len(dataset))])
    assert left.sum() == 24 and len(left) == 84
    np.testing.assert_allclose(weights[left], 1 / 24)
    np.testing.assert_allclose(weights[~left], 1 / 60)
    drawn = sum(list(train.StepBatchSampler(len(dataset), 64, seed=0, start_step=0, steps=40, weights=weights)), [])
    assert 0.42 < left[drawn].mean() < 0.58  # 29% of the frames, half of the draws
