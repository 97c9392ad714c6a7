"""Real-dataset shapes, on data made here: several cameras of different sizes and storages for one policy, a dataset
without ``observation.state`` (an image-only policy), cameras chosen by config, a configured camera that is missing."""

from __future__ import annotations

import os
from pathlib import Path

import action_tokenizers as at
import numpy as np
import pytest
import torch

from vla import train
from vla.config import load_config
from vla.data.columns import action_chunks, chunk_states
from vla.data.reader import dataset_info
from vla.data.torch_dataset import ActionChunkDataset
from vla.policy import VLAConfig, VLAPolicy
from vla.policy.pipeline import IMAGES, SEQUENCE, Collate

A, B = "observation.images.top", "observation.images.wrist"  # 64x64 video, 48x80 PNG
T, EPISODES, FRAMES = 4, 2, 12

pytestmark = pytest.mark.usefixtures("one_torch_thread")
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration per encoded episode otherwise


def make_dataset(root: Path, *, state: bool) -> Path:
    """``EPISODES`` episodes of ``FRAMES`` frames: camera A a 64x64 video, camera B a 48x80 PNG, a 2-D action (and a
    3-D state when ``state``); frame k of episode e shows a bright square at column 4k (+ 7e) on a ramp."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        A: {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]},
        B: {"dtype": "image", "shape": (48, 80, 3), "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    }
    if state:
        features["observation.state"] = {"dtype": "float32", "shape": (3,), "names": ["a", "b", "c"]}
    ds = LeRobotDataset.create(
        "local/shapes", fps=10, features=features, root=root, use_videos=True, video_backend="pyav"
    )
    for e in range(EPISODES):
        for k in range(FRAMES):
            frame = {"action": np.array([e, k / FRAMES], np.float32), "task": "move the square"}
            for key, (h, w) in ((A, (64, 64)), (B, (48, 80))):
                image = np.broadcast_to(np.linspace(0, 120, w, dtype=np.uint8)[None, :, None], (h, w, 3)).copy()
                image[8:20, 4 * k + 7 * e : 4 * k + 7 * e + 12] = (250, 200, 30)
                frame[key] = image
            if state:
                frame["observation.state"] = np.array([e, k, -k], np.float32)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def two_cameras(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("shapes") / "two_cameras", state=True)


@pytest.fixture(scope="module")
def image_only(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("shapes") / "image_only", state=False)


def micro_policy(root: Path, image_keys: list[str], **overrides) -> VLAPolicy:
    info = dataset_info(root)
    chunks, _ = action_chunks(info, T)
    action_norm = at.Normalizer.fit(chunks.reshape(-1, 2))
    tokenizer = at.BinningTokenizer.fit(action_norm.normalize(chunks), n_bins=32)
    state_norm = at.Normalizer.fit(chunk_states(info)) if info.state_dim else None
    config = VLAConfig(
        preset="micro",
        time_horizon=T,
        n_action_steps=2,
        image_keys=image_keys,
        image_size=32,
        image_shift=0,
        device="cpu",
        init_seed=0,
        **overrides,
    )
    return VLAPolicy(config, action_tokenizer=tokenizer, action_normalizer=action_norm, state_normalizer=state_norm)


def test_cameras_of_different_sizes_and_storages_stack_for_one_policy(two_cameras):
    info = dataset_info(two_cameras)
    assert [info.camera_text(k) for k in info.camera_keys] == [f"{A} 64x64 video (av1)", f"{B} 48x80 png"]
    memory = ActionChunkDataset(info, T, image_size=32, backend="memory", progress=False)
    lerobot = ActionChunkDataset(info, T, image_size=32, backend="lerobot")
    for i in (0, 7, 13, len(memory) - 1):
        m, r = memory[i], lerobot[i]
        assert m.keys() == r.keys() and m[A].shape == m[B].shape == (3, 32, 32)  # both squares of the policy's size
        for key in (A, B):  # resized once then stored as uint8: within half a grey level of resizing each sample
            assert (m[key] - r[key]).abs().max() <= 0.5 / 255 + 1e-6
    policy = micro_policy(two_cameras, [A, B])
    batch = Collate(policy.pipeline.training)([memory[i] for i in range(4)])
    assert batch[IMAGES].shape == (4, 2, 3, 32, 32)
    loss, _ = policy(batch)
    assert torch.isfinite(loss)


def test_image_only_dataset_trains_a_policy_without_state(image_only, tmp_path):
    info = dataset_info(image_only)
    assert info.state_dim is None
    memory = ActionChunkDataset(info, T, image_size=32, backend="memory", progress=False)
    lerobot = ActionChunkDataset(info, T, image_size=32, backend="lerobot")
    assert set(memory[3]) == set(lerobot[3]) == {A, B, "task", "action", "action_is_pad"}  # no state

    policy = micro_policy(image_only, [A], state_dim=0)
    assert policy.state_normalizer is None and policy.model.state_encoder is None
    # The prefix: the camera's image tokens, then BOS "Task: {task};\n" (no state slot, no state text)
    batch = Collate(policy.pipeline.training)([memory[i] for i in range(4)])
    seq = batch[SEQUENCE]
    assert seq.state.shape == (4, 0) and not seq.state_slots.any()
    text = policy.layout.prefix_text_ids("move the square", np.zeros(0))
    assert text == [policy.vocab.text.bos_id, *policy.vocab.text.encode("Task: move the square;\n")]
    assert (
        policy.layout.prefix_ids("move the square", np.zeros(0))[: policy.layout.num_image_tokens]
        == [policy.vocab.text.image_id] * policy.model.image_tokens
    )

    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]
    for step in range(3):
        batch = Collate(policy.pipeline.training)([memory[(4 * step + i) % len(memory)] for i in range(4)])
        loss, _ = policy(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))

    policy.eval()
    obs = {A: memory[5][A][None], "task": ["move the square"]}  # no state in the observation
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (1, T, 2) and torch.isfinite(chunk).all()
    policy.save_pretrained(tmp_path / "policy")
    assert not (tmp_path / "policy" / "state_normalizer.json").exists()
    again = VLAPolicy.from_pretrained(tmp_path / "policy")
    assert again.config.state_dim == 0
    torch.testing.assert_close(again.predict_action_chunk(obs), chunk)

    with pytest.raises(ValueError, match="state_dim = 0"):
        VLAConfig(state_dim=0, relative_actions=[True, False])


def test_image_keys_from_the_config_choose_a_camera(two_cameras, tmp_path, capsys):
    """``--policy.image_keys`` picks the dataset's second camera (not the first, not all); the memory backend serves it."""
    cfg = load_config(
        args=[
            f"--dataset_root={two_cameras}",
            f"--output_dir={tmp_path}",
            "--steps=2",
            "--batch_size=4",
            "--save_every=2",
            "--log_every=1",
            "--progress=false",
            "--ema_decay=0",
            "--tokenizer.type=bin",
            "--tokenizer.n_bins=32",
            "--policy.preset=micro",
            f"--policy.time_horizon={T}",
            "--policy.n_action_steps=2",
            "--policy.device=cpu",
            f"--policy.image_keys=[{B}]",
            "--policy.image_size=32",
        ]
    )
    summary = train.main(cfg)
    assert np.isfinite(summary["final_loss"])
    assert "dataset backend: memory" in capsys.readouterr().out
    policy = VLAPolicy.from_pretrained(tmp_path / "policy")
    assert policy.config.image_keys == [B] and policy.layout.num_cameras == 1


def test_a_missing_camera_names_the_cameras_present(two_cameras, tmp_path):
    missing = "observation.images.wirst"
    for backend in ("memory", "lerobot", "auto"):
        with pytest.raises(ValueError, match=f"did you mean '{B}'.*cameras present: {A}, {B}"):
            ActionChunkDataset(two_cameras, T, image_keys=[missing], backend=backend)
    cfg = load_config(
        args=[
            f"--dataset_root={two_cameras}",
            f"--output_dir={tmp_path}",
            "--steps=2",
            "--batch_size=4",
            "--progress=false",
            "--tokenizer.type=bin",
            "--policy.preset=micro",
            f"--policy.time_horizon={T}",
            "--policy.n_action_steps=2",
            "--policy.device=cpu",
            f"--policy.image_keys=[{missing}]",
        ]
    )
    with pytest.raises(ValueError, match=f"{missing!r} is not a camera.*cameras present: {A}, {B}"):
        train.main(cfg)
    policy = micro_policy(two_cameras, [A, B])  # at inference: the observation lacks a camera the policy reads
    with pytest.raises(ValueError, match=f"lacks camera '{B}'.*cameras present: {A}"):
        policy.predict_action_chunk({A: torch.rand(1, 3, 64, 64), "observation.state": torch.zeros(1, 3), "task": "t"})
