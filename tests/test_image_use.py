"""scripts/image_use.py, the check that a camera policy reads its camera: on a policy that does (a fresh one, whose
tokens still carry the image) and on one that cannot (its tower made blind)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import action_tokenizers as at
import numpy as np
import pytest
import torch

from vla.data.columns import action_chunks
from vla.data.reader import dataset_info
from vla.data.stats import frame_stats
from vla.policy import VLAConfig, VLAPolicy

REPO = Path(__file__).parents[1]
CAM = "observation.images.corner2"


def image_use():
    spec = importlib.util.spec_from_file_location("image_use", REPO / "scripts" / "image_use.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def camera_policy(tiny_image_dataset_root):
    info = dataset_info(tiny_image_dataset_root)
    stats = frame_stats(info, ["action", "observation.state"])
    action_norm = at.Normalizer.from_stats(stats["action"], "quantile")
    chunks, _ = action_chunks(info, 4)
    config = VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, image_keys=[CAM], device="cpu", init_seed=0)
    return VLAPolicy(
        config,
        action_tokenizer=at.get_tokenizer_class("bin").fit(action_norm.normalize(chunks)),
        action_normalizer=action_norm,
        state_normalizer=at.Normalizer.from_stats(stats["observation.state"], "quantile"),
    ).eval()


def test_a_policy_with_a_working_tower_reads_its_camera(camera_policy, tiny_image_dataset_root):
    result = image_use().measure(camera_policy, tiny_image_dataset_root, starts=2, batch=8)
    assert set(result["loss"]) == {"real", "blank", "noise"}
    # the image changes the loss (an untrained micro policy: by ~1e-4; a blind one below by not even 1e-6)
    assert abs(result["loss"]["real"] - result["loss"]["blank"]) > 2e-5
    assert result["image_token_spread"] > 1e-3 and result["episode_starts"] == 2
    assert len(result["first_action_std"]["policy"]) == len(result["first_action_std"]["expert"])


def test_a_blind_tower_is_caught(camera_policy, tiny_image_dataset_root):
    blind = VLAPolicy(
        camera_policy.config,
        action_tokenizer=camera_policy.action_tokenizer,
        action_normalizer=camera_policy.action_normalizer,
        state_normalizer=camera_policy.state_normalizer,
    ).eval()
    with torch.no_grad():
        projector = blind.model.backbone.model.multi_modal_projector.linear
        projector.weight.zero_()  # every image token is the bias: the collapse the README describes
        projector.bias.fill_(5.0)
    result = image_use().measure(blind, tiny_image_dataset_root, starts=2, batch=8)
    assert abs(result["loss"]["real"] - result["loss"]["blank"]) < 1e-6
    assert abs(result["loss"]["real"] - result["loss"]["noise"]) < 1e-6
    assert result["image_token_spread"] < 1e-6
    np.testing.assert_allclose(result["first_action_std"]["policy"], 0.0, atol=1e-6)


def test_the_command_writes_its_json(camera_policy, tiny_image_dataset_root, tmp_path):
    camera_policy.save_pretrained(tmp_path / "policy")
    out = tmp_path / "use.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "image_use.py"),
            "--policy",
            str(tmp_path / "policy"),
            "--dataset",
            str(tiny_image_dataset_root),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["policy"] == str(tmp_path / "policy")
