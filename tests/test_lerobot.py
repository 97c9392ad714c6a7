"""LeRobot's own commands find the policy: the stock ``lerobot-train --policy.type=vla`` (through the plugin
distribution ``lerobot_policy_vla`` that ``make setup`` installs), and ``vla eval`` on the checkpoint it writes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_plugin_distribution_is_what_lerobot_discovers():
    names = [d.metadata.get("Name") for d in importlib.metadata.distributions()]
    assert "lerobot_policy_vla" in names  # LeRobot imports distributions whose name starts with lerobot_policy_
    import lerobot_policy_vla

    from lerobot.configs import PreTrainedConfig

    assert PreTrainedConfig.get_choice_class("vla") is lerobot_policy_vla.VLAConfig


@pytest.mark.slow
def test_stock_lerobot_train_then_vla_eval_on_its_checkpoint(tiny_dataset_root, tmp_path):
    from vla.cli import main

    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    assert main(["tokenizer", "fit", "--root", str(tiny_dataset_root), "--type", "fast", "--time-horizon", "10",
                 "--out", str(tmp_path / "tok")]) == 0  # fmt: skip
    lerobot_train = shutil.which("lerobot-train", path=str(Path(sys.executable).parent))
    args = [lerobot_train, "--policy.type=vla", f"--policy.action_tokenizer_path={tmp_path / 'tok'}",
            "--policy.device=cpu", "--policy.preset=micro", "--dataset.repo_id=local/push",
            f"--dataset.root={tiny_dataset_root}", f"--output_dir={tmp_path / 'run'}", "--steps=2", "--batch_size=4",
            "--num_workers=0", "--save_freq=2", "--log_freq=1", "--wandb.enable=false"]  # fmt: skip
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "000002" / "pretrained_model"
    assert json.loads((checkpoint / "config.json").read_text())["type"] == "vla"
    assert main(["eval", "--policy", str(checkpoint), "--episodes", "1", "--max-steps", "5",
                 "--out", str(tmp_path / "eval")]) == 0  # fmt: skip
    report = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    assert report["episodes"] == 1 and report["valid_chunk_rate"] == 1.0
