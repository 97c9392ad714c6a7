"""Training faults a user met, reproduced through the CLI: what they now see (one line naming the fix) and that
nothing was written or lost. Companion of tests/test_faults.py, for the run folder, saved policy folders and stops."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil

import pytest

from tests.conftest import train_micro_policy
from vla import checkpoints, train
from vla.checkpoints import CHECKPOINTS
from vla.cli import main

MICRO = [
    "--policy.preset=micro",
    "--policy.time_horizon=4",
    "--policy.n_action_steps=2",
    "--policy.n_obs_steps=1",
    "--policy.scheduler_warmup_steps=1",
    "--policy.scheduler_decay_steps=4",
    "--policy.device=cpu",
    "--tokenizer.type=fast",
    "--tokenizer.vocab_size=256",
    "--heldout_episodes=0",
    "--batch_size=4",
    "--save_every=2",
    "--log_every=1",
    "--progress=false",
]


def vla_train(root, out, steps, *extra) -> list[str]:
    return ["train", f"--dataset_root={root}", f"--output_dir={out}", f"--steps={steps}", *MICRO, *extra]


def one_line_error(capsys, command: str) -> str:
    """The CLI's stderr, checked to be one line without a traceback; returned for the message's own checks."""
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vla {command}:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes: a refused command must leave it as it was."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoint_steps(run) -> list[str]:
    return sorted(p.name for p in (run / CHECKPOINTS).iterdir())


# --- 1. resume compares the folders paths name, not their spelling ---------------------------------------------------
def test_resume_accepts_its_own_paths_spelled_differently(tiny_dataset_root, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run1"
    assert main(vla_train(tiny_dataset_root, run, 2)) == 0
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(tiny_dataset_root, tmp_path)  # the same dataset, spelled from here
    assert main(vla_train(relative, "run1", 4, "--resume=true")) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]

    other = tmp_path / "other"  # a copy is another folder: refused, and the message says they differ
    shutil.copytree(tiny_dataset_root, other)
    before = snapshot(run)
    capsys.readouterr()
    assert main(vla_train("other", "run1", 6, "--resume=true")) == 1
    err = one_line_error(capsys, "train")
    assert "cannot change mid-run (dataset_root:" in err and f"'other' is {other.resolve()}" in err
    assert "different folders" in err and "output_dir:" not in err  # the folder being resumed is the run
    assert snapshot(run) == before


def test_resume_refuses_a_dataset_recorded_again_in_the_same_folder(tiny_dataset_root, tmp_path, capsys):
    """The same path with other data (re-recorded, extended) would mix two datasets under the first one's
    normalisation: refused, the folder untouched, and the way out (a fine-tune from the checkpoint) works."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    shutil.copytree(tiny_dataset_root, data)
    run = tmp_path / "run"
    assert main(vla_train(data, run, 2)) == 0
    assert json.loads((run / "dataset.json").read_text())["sha256"]  # the run names the data it trained on
    assert main(vla_train(data, run, 4, "--resume=true")) == 0  # the same data: resumed

    parquet = next((data / "data").rglob("*.parquet"))  # recorded again: other actions, same path and layout
    table = pq.read_table(parquet)
    column = table.column_names.index("action")
    halved = pa.array([[0.5 * a for a in row] for row in table.column(column).to_pylist()], table.schema[column].type)
    pq.write_table(table.set_column(column, table.schema[column], halved), parquet)
    before = snapshot(run)
    capsys.readouterr()
    assert main(vla_train(data, run, 6, "--resume=true")) == 1
    err = one_line_error(capsys, "train")
    assert f"the dataset at {data} is not the one this run started on: its files changed" in err
    assert f"--policy.path={run / CHECKPOINTS / 'step_0000004' / 'policy'}" in err  # the advice, tried below
    assert snapshot(run) == before
    checkpoint_policy = run / CHECKPOINTS / "step_0000004" / "policy"
    tune = ["--steps=2", "--heldout_episodes=0", "--batch_size=4", "--progress=false"]  # the policy's own settings
    assert (
        main(
            [
                "train",
                f"--dataset_root={data}",
                f"--output_dir={tmp_path / 'tuned'}",
                *tune,
                f"--policy.path={checkpoint_policy}",
            ]
        )
        == 0
    )

    (run / "dataset.json").unlink()  # a run made before runs kept a fingerprint: not checked
    assert main(vla_train(data, run, 6, "--resume=true")) == 0
    assert (run / "dataset.json").is_file()


# --- 2. saved policy folders ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_policy(tiny_dataset_root, tmp_path_factory):
    return train_micro_policy(tiny_dataset_root, tmp_path_factory.mktemp("saved"))


def broken_copy(saved_policy, tmp_path, text: str | None = None, **fields):
    folder = tmp_path / "policy"
    shutil.copytree(saved_policy, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(text if text is not None else json.dumps({**config, **fields}))
    return folder


@pytest.mark.parametrize(
    ("fields", "text", "expected"),
    [
        (
            {"time_horizon": "ten"},
            None,
            'config.json: time_horizon = "ten" is not an integer or null; set it to an integer',
        ),
        ({"text_words": 3}, None, "config.json: text_words = 3 is not a list of strings"),
        ({"time_horizon": 0}, None, "config.json: VLAConfig.time_horizon = 0 is invalid: use a positive number"),
        (
            {"time_horzon": 4},
            None,
            "config.json has a field VLAConfig does not know: 'time_horzon'; did you mean 'time_horizon'?; remove it",
        ),
        ({}, "", "config.json is not valid JSON (Expecting value: line 1 column 1 (char 0)); save it again"),
    ],
)
def test_a_broken_policy_config_names_the_file_and_the_field(saved_policy, tmp_path, capsys, fields, text, expected):
    folder = broken_copy(saved_policy, tmp_path, text, **fields)
    before = snapshot(folder)
    assert main(["inspect", "--policy", str(folder), "--out", str(tmp_path / "inspect")]) == 1
    err = one_line_error(capsys, "inspect")
    assert str(folder / "config.json") in err and expected in err
    assert not (tmp_path / "inspect").exists() and snapshot(folder) == before
    # vla eval (and vla serve) load the folder the same way: the same line, before any episode
    assert main(["eval", "--policy", str(folder), "--episodes", "1", "--out", str(tmp_path / "eval")]) == 1
    assert expected in one_line_error(capsys, "eval") and not (tmp_path / "eval").exists()


def test_processor_steps_are_refused_for_what_is_wrong_with_them(saved_policy, tmp_path, capsys):
    folder = broken_copy(saved_policy, tmp_path)
    path = folder / "policy_preprocessor.json"
    pipeline = json.loads(path.read_text())
    names = [s["registry_name"] for s in pipeline["steps"]]
    # LeRobot's own normaliser names are there, as identity, for lerobot-train --policy.path (test_lerobot.py)
    assert names[2:4] == ["normalizer_processor", "device_processor"]
    cases = [
        (
            {**pipeline["steps"][0], "class": "os.system"},
            "step 0 ('rename_observations_processor') carries a 'class' entry ('os.system'), which a VLA policy never "
            "writes: loading the folder through LeRobot would import and run that code",
        ),
        ({"class": "subprocess.getoutput", "config": {"cmd": "id"}}, "would import and run that code"),
        (
            {**pipeline["steps"][1], "hook": "x"},
            "step 0 ('to_batch_processor') carries 'hook', which a VLA policy never writes",
        ),
        (
            {**pipeline["steps"][2], "config": {**pipeline["steps"][2]["config"], "norm_map": {"STATE": "MEAN_STD"}}},
            "step 0 ('normalizer_processor') is LeRobot's normaliser with norm_map {'STATE': 'MEAN_STD'}",
        ),
    ]
    for step, expected in cases:
        path.write_text(json.dumps({**pipeline, "steps": [step]}))
        before = snapshot(folder)
        assert main(["inspect", "--policy", str(folder), "--out", str(tmp_path / "inspect")]) == 1
        err = one_line_error(capsys, "inspect")
        assert expected in err, err
        assert not (tmp_path / "inspect").exists() and snapshot(folder) == before


# --- 3. full disk, Ctrl-C, a run that saved nothing, an output path that cannot be a folder ------------------------
def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(
    tiny_dataset_root, tmp_path, monkeypatch, capsys
):
    real = checkpoints.save_file

    def save_file(tensors, filename, *args, **kwargs):
        if ".step_0000004.tmp-" in filename:  # the second checkpoint's temporary folder: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "save_file", save_file)
    run = tmp_path / "run"
    assert main(vla_train(tiny_dataset_root, run, 4)) == 1
    err = one_line_error(capsys, "train")
    assert f"no space left on the disk of {run} to write the checkpoint of step 4: it needs about " in err
    assert re.search(r"needs about [\d.]+ [KMG]B, [\d.]+ [KMGT]?B are free; nothing was half-written and the", err)
    assert "(checkpoints/step_0000002) is intact" in err and err.endswith("then resume with --resume=true")
    assert checkpoint_steps(run) == ["last.json", "step_0000002"]  # no half-written step 4, no debris
    assert json.loads((run / CHECKPOINTS / "last.json").read_text())["step"] == 2
    assert not (run / "policy").exists() and not list(run.glob(".*"))
    monkeypatch.setattr(checkpoints, "save_file", real)  # space freed: the advice works
    assert main(vla_train(tiny_dataset_root, run, 4, "--resume=true")) == 0
    assert (run / "policy" / "model.safetensors").is_file()


def test_ctrl_c_says_where_the_run_stands_and_the_advice_works(tiny_dataset_root, tmp_path, monkeypatch, capsys):
    real, calls = train.to_device, {"n": 0, "stop_at": 4}

    def to_device(batch, device):  # Ctrl-C while step `stop_at` starts
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise KeyboardInterrupt
        return real(batch, device)

    monkeypatch.setattr(train, "to_device", to_device)
    run = tmp_path / "run"
    assert main(vla_train(tiny_dataset_root, run, 6)) == 130
    err = one_line_error(capsys, "train")
    assert err == (
        f"vla train: stopped at step 3 (Ctrl-C); the last checkpoint is step 2 ({run}/checkpoints/"
        "step_0000002): resume with --resume=true (step 3 is redone)"
    )
    assert checkpoint_steps(run) == ["last.json", "step_0000002"]
    calls.update(n=0, stop_at=0)
    assert main(vla_train(tiny_dataset_root, run, 6, "--resume=true")) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]

    # before the first checkpoint: said so, and the same command starts the run again in place
    calls.update(n=0, stop_at=2)
    fresh = tmp_path / "fresh"
    assert main(vla_train(tiny_dataset_root, fresh, 6)) == 130
    err = one_line_error(capsys, "train")
    assert err == (
        f"vla train: stopped at step 1 (Ctrl-C), before the first checkpoint (every 2 steps), so no "
        f"checkpoint was written; the same command starts the run again in {fresh}"
    )
    calls.update(n=0, stop_at=0)
    assert main(vla_train(tiny_dataset_root, fresh, 6)) == 0
    out = capsys.readouterr().out
    assert (
        f"{fresh} holds a run that saved no checkpoint (train_config.json, dataset.json, metrics.jsonl): starting it again"
        in out
    )


def test_a_run_that_diverged_before_its_first_checkpoint_starts_again_in_place(tiny_dataset_root, tmp_path, capsys):
    run = tmp_path / "run"
    wild = [
        "--policy.optimizer_lr=1e9",
        "--policy.scheduler_decay_lr=1e9",
        "--policy.optimizer_grad_clip_norm=1e9",
        "--policy.scheduler_warmup_steps=0",
        "--save_every=50",
    ]
    assert main(vla_train(tiny_dataset_root, run, 6, *wild)) == 1
    err = one_line_error(capsys, "train")
    assert "diverged at step" in err and "the last good checkpoint is none" in err
    assert err.endswith("run again in place (the folder holds no checkpoint, so it starts over)")
    assert (run / "train_config.json").is_file()  # the run it left: refused before, now started again
    assert main(vla_train(tiny_dataset_root, run, 2)) == 0  # a sane lr, the same folder, no flag
    assert json.loads((run / "train_config.json").read_text())["policy"]["optimizer_lr"] == 3e-3
    assert main(vla_train(tiny_dataset_root, run, 2, "--overwrite=true")) == 0  # a finished run: flag needed
    assert main(vla_train(tiny_dataset_root, run, 2)) == 1
    assert "already holds a run" in one_line_error(capsys, "train")


def test_an_output_dir_that_cannot_be_a_folder_is_named_before_any_work(
    tiny_dataset_root, tmp_path, monkeypatch, capsys
):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me\n")
    cases = [
        (a_file / "run", f"--output_dir {a_file / 'run'} cannot be created: {a_file} is a file, not a folder"),
        (a_file, f"--output_dir {a_file} is a file, not a folder; choose another --output_dir"),
    ]
    for out, expected in cases:
        assert main(vla_train(tiny_dataset_root, out, 2)) == 1
        assert expected in one_line_error(capsys, "train")
    assert a_file.read_text() == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

    real = checkpoints.tempfile.mkdtemp

    def mkdtemp(suffix=None, prefix=None, dir=None):  # a folder this user may not write in (simulated: root may)
        if dir is not None and os.path.samefile(dir, tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(suffix, prefix, dir)

    monkeypatch.setattr(checkpoints.tempfile, "mkdtemp", mkdtemp)
    assert main(vla_train(tiny_dataset_root, tmp_path / "locked" / "run", 2)) == 1
    err = one_line_error(capsys, "train")
    assert f"--output_dir {tmp_path / 'locked' / 'run'} cannot be written: {tmp_path} refuses new files " in err
    assert "(Permission denied); choose a folder you can write" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
