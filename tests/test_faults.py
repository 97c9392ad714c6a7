"""Nothing silent, nothing lost: each fault a user met, reproduced, and what they now get."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla import evaluate, train
from vla.checkpoints import CHECKPOINTS
from vla.config import TrainConfig, load_config
from vla.policy import VLAConfig
from vla.tokenizer_choice import tokenizer_config


def config(root, out, steps=2, **kw) -> TrainConfig:
    policy = kw.pop(
        "policy",
        VLAConfig(
            preset="micro",
            time_horizon=4,
            n_action_steps=2,
            scheduler_warmup_steps=1,
            scheduler_decay_steps=2,
            device="cpu",
        ),
    )
    return TrainConfig(
        dataset_root=str(root),
        output_dir=str(out),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        policy=policy,
        steps=steps,
        batch_size=4,
        save_every=2,
        log_every=1,
        progress=False,
        **kw,
    )


def test_a_diverged_run_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tiny_dataset_root, tmp_path):
    policy = VLAConfig(
        preset="micro",
        time_horizon=4,
        n_action_steps=2,
        optimizer_lr=1e9,
        scheduler_decay_lr=1e9,
        optimizer_grad_clip_norm=1e9,
        scheduler_warmup_steps=0,
        device="cpu",
    )
    with pytest.raises(train.Diverged, match=r"diverged at step \d+.*last good checkpoint"):
        train.main(config(tiny_dataset_root, tmp_path, steps=6, policy=policy))
    assert not (tmp_path / "policy").exists()  # no policy with NaN weights was saved
    for ckpt in (tmp_path / CHECKPOINTS).glob("step_*"):
        from safetensors.torch import load_file

        weights = load_file(str(ckpt / "policy" / "model.safetensors"))
        assert all(np.isfinite(w.numpy()).all() for w in weights.values())


def test_a_run_folder_is_one_run(tiny_dataset_root, tmp_path):
    train.main(config(tiny_dataset_root, tmp_path, seed=0))
    with pytest.raises(ValueError, match="already holds a run.*--resume=true.*--overwrite=true"):
        train.main(config(tiny_dataset_root, tmp_path, seed=1))
    before = (tmp_path / "train_config.json").read_text()
    with pytest.raises(ValueError, match="cannot change mid-run.*seed: 0 -> 1"):
        train.main(config(tiny_dataset_root, tmp_path, steps=4, seed=1, resume=True))
    lr = VLAConfig(
        preset="micro",
        time_horizon=4,
        n_action_steps=2,
        scheduler_warmup_steps=1,
        scheduler_decay_steps=2,
        optimizer_lr=1e-2,
        device="cpu",
    )
    with pytest.raises(ValueError, match="policy.optimizer_lr"):
        train.main(config(tiny_dataset_root, tmp_path, steps=4, resume=True, policy=lr))
    assert (tmp_path / "train_config.json").read_text() == before  # a refused resume rewrites nothing
    again = train.main(config(tiny_dataset_root, tmp_path, seed=1, overwrite=True))  # told to: the old run goes
    assert again["steps"] == 2 and json.loads((tmp_path / "train_config.json").read_text())["seed"] == 1


def test_resume_names_its_step_cleans_debris_never_repeats_metrics_drops_a_torn_row_and_prunes(
    tiny_dataset_root, tmp_path, capsys
):
    train.main(config(tiny_dataset_root, tmp_path, steps=4, keep_last=1))
    assert [p.name for p in (tmp_path / CHECKPOINTS).glob("step_*")] == ["step_0000004"]  # keep_last=1
    (tmp_path / CHECKPOINTS / ".step_0000006.tmp-abc").mkdir()  # what a kill during a save leaves
    (tmp_path / ".policy.tmp-xyz").mkdir()
    with (tmp_path / "metrics.jsonl").open("a") as f:  # a kill or a full disk in the middle of a row's append
        f.write('{"step": 5, "loss": 1.2')
    summary = train.main(config(tiny_dataset_root, tmp_path, steps=6, resume=True, keep_last=1))
    out = capsys.readouterr().out
    assert "from checkpoints/step_0000004 at step 4" in out and "removed .step_0000006.tmp-abc" in out
    assert not list(tmp_path.glob(".*")) and not list((tmp_path / CHECKPOINTS).glob(".*"))
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6] and summary["steps"] == 6
    # the natural retry after a kill during the final save: resume at the final step succeeds
    final = train.main(config(tiny_dataset_root, tmp_path, steps=6, resume=True, keep_last=1))
    assert final["steps"] == 6 and np.isfinite(final["final_loss"]) and (tmp_path / "policy").is_dir()


def test_config_errors_are_one_line_naming_the_value(tmp_path, capsys):
    from vla.cli import main

    with pytest.raises(ValueError, match="optimizer_lr = -0.001 is invalid"):
        load_config("configs/debug.yaml", ["--policy.optimizer_lr=-1e-3"])
    for args, message in [
        (["--batch_size=0"], "batch_size must be >= 1"),
        (["--policy.time_horizon=0"], "time_horizon = 0"),
        (["--config_path=configs/nope.yaml"], "no config file"),
    ]:
        assert main(["train", "--config_path=configs/debug.yaml", *args]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_eval_checks_its_arguments_before_any_episode(tiny_dataset_root, tmp_path):
    run = tmp_path / "run"
    policy = train.main(config(tiny_dataset_root, run))["policy_path"]
    out_file = tmp_path / "taken.json"
    out_file.write_text("{}")
    for kwargs, message in [
        ({"out_dir": out_file}, "is a file"),
        ({"n_action_steps": 99}, "outside the policy's chunk: use 1..4"),
        ({"n_action_steps": 0}, "outside the policy's chunk"),
        ({"gif_episodes": 2}, "has none"),
    ]:
        with pytest.raises(ValueError, match=message):
            evaluate.evaluate(policy, "metaworld/push-v3", 1, progress=False, **kwargs)


@pytest.fixture(scope="module")
def saved_policy(tiny_dataset_root, tmp_path_factory):
    run = tmp_path_factory.mktemp("saved")
    return train.main(config(tiny_dataset_root, run))["policy_path"]


def copy_of(path, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(path, target)
    return target


def test_a_folder_with_non_finite_weights_is_refused(saved_policy, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from vla.policy import VLAPolicy

    folder = copy_of(saved_policy, tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    save_file(
        {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in weights.items()},
        str(folder / "model.safetensors"),
    )
    with pytest.raises(ValueError, match="NaN or inf in .* tensors.*diverged"):
        VLAPolicy.from_pretrained(folder)


def test_a_truncated_weights_file_names_the_file_and_the_fix(saved_policy, tmp_path):
    from vla.policy import VLAPolicy

    folder = copy_of(saved_policy, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors cannot be read .*save the policy again"):
        VLAPolicy.from_pretrained(folder)


def test_processor_files_naming_foreign_code_are_refused_before_loading(saved_policy, tmp_path):
    from vla.policy import VLAPolicy

    folder = copy_of(saved_policy, tmp_path)
    steps = json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
    assert "normalizer_processor" in [s["registry_name"] for s in steps]  # the policy's own steps are known
    crafted = {"name": "policy_preprocessor", "steps": [{"class": "subprocess.getoutput", "config": {"cmd": "id"}}]}
    (folder / "policy_preprocessor.json").write_text(json.dumps(crafted))
    with pytest.raises(ValueError, match="would import and run that code"):
        VLAPolicy.from_pretrained(folder)
    crafted["steps"] = [{"registry_name": "device_processor", "class": "os.system", "config": {}}]
    (folder / "policy_preprocessor.json").write_text(json.dumps(crafted))
    with pytest.raises(ValueError, match="never writes"):
        VLAPolicy.from_pretrained(folder)
    crafted["steps"] = [{"registry_name": "normalizer_processor", "config": {}}]  # LeRobot's: it would normalise twice
    (folder / "policy_preprocessor.json").write_text(json.dumps(crafted))
    with pytest.raises(ValueError, match="never writes"):
        VLAPolicy.from_pretrained(folder)


def test_nan_in_a_datasets_actions_is_named_by_episode_and_frame(tiny_dataset_root, tmp_path, capsys):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from vla.cli import main

    root = tmp_path / "ds"
    shutil.copytree(tiny_dataset_root, root)
    path = sorted((root / "data").glob("*/*.parquet"))[0]
    table = pq.read_table(path)
    actions = table.column("action").to_pylist()
    episodes = table.column("episode_index").to_pylist()
    row = episodes.index(1) + 7  # episode 1, frame 7
    actions[row][2] = float("nan")
    index = table.schema.get_field_index("action")
    table = table.set_column(index, table.schema.field(index), pa.array(actions, type=table.schema.field(index).type))
    pq.write_table(table, path)
    assert main(["data", "info", str(root)]) == 0
    assert (
        "'action' holds NaN or inf: 1 values in 1 frames, the first in episode 1 at frame 7" in capsys.readouterr().out
    )
    with pytest.raises(ValueError, match="episode 1 at frame 7. Fix or drop those frames"):
        train.main(config(root, tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_images_with_nan_are_refused_naming_the_camera():
    import action_tokenizers as at
    import torch

    from tests.conftest import D, T, fitted_tokenizers
    from vla.policy import VLAPolicy

    cam = "observation.images.front"
    config = VLAConfig(preset="micro", time_horizon=T, n_action_steps=2, image_keys=[cam], device="cpu", init_seed=0)
    policy = VLAPolicy(
        config,
        action_tokenizer=fitted_tokenizers()["bin"],
        action_normalizer=at.Normalizer.identity(D),
        state_normalizer=at.Normalizer.identity(2),
    )
    image = torch.rand(1, 3, 16, 16)
    image[0, 1, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="observation.images.front'\\] holds NaN or inf; check the camera"):
        policy.predict_action_chunk({"observation.state": torch.zeros(1, 2), "task": ["push"], cam: image})
