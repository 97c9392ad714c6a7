"""``vla study`` under faults: a changed study file, records overwritten or dropped, two runs in one folder, a study
stopped by a signal, arguments that would falsify provenance, mistakes found only after training, broken files.
Each fault is reproduced through the command line (or the public API) and must end in one line that names the fix,
with nothing written, lost or left running."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vla.cli import main as cli
from vla.study import load_study
from vla.study.commands import identity, train_command
from vla.study.lock import LOCK_FILE
from vla.study.report import write_results
from vla.study.runner import finished

ROOT = Path(__file__).parents[1]


def _study_text(dataset, *, steps=2, seeds="[0, 1, 2]", name="faults", extra=""):
    return "\n".join(
        [
            f"name: {name}",
            f"dataset: {dataset}",
            "config: configs/debug.yaml",
            f"train: [--steps={steps}]",
            "tokenizers: {bin: [--tokenizer.type=bin, --tokenizer.n_bins=32], fast: [--tokenizer.type=fast]}",
            f"seeds: {seeds}",
            "eval: {env: metaworld, task: push-v3, episodes: 2, args: [--max-steps, '6']}",
            extra,
        ]
    )


@pytest.fixture()
def fake(tmp_path):
    """A study whose every run is finished in results/runs.json (records made here, nothing trained), its dataset a
    one-file folder."""
    from vla.provenance import dataset_fingerprint

    data = tmp_path / "data"
    (data / "meta").mkdir(parents=True)
    (data / "meta" / "info.json").write_text("{}")
    sha = dataset_fingerprint(data)["sha256"]
    path = tmp_path / "faults.yaml"
    path.write_text(_study_text(data))
    study = load_study(path)
    results, work = tmp_path / "results", tmp_path / "work"
    records = [_record(study, run, wins=1 + run.seed, sha=sha) for run in study.runs()]
    write_results(study, records, results, {"sha256": sha})

    class Fake:
        pass

    f = Fake()
    f.data, f.sha, f.path, f.study, f.results, f.work, f.records = data, sha, path, study, results, work, records
    f.runs_json = results / "runs.json"
    f.args = ["--work", str(work), "--results", str(results), "--allow-dirty"]
    return f


def _record(study, run, wins, sha):
    """A finished run's record as the runner writes it (what produced it, four episodes, a provenance block)."""
    command = ["vla", *train_command(study, run, Path("w") / run.id)[3:]]
    return {
        "id": run.id,
        "setting": run.setting,
        "tokenizer": run.tokenizer,
        "seed": run.seed,
        "overrides": list(run.overrides),
        "identity": identity(study, run),
        "successes": [True] * wins + [False] * (4 - wins),
        "episode_seeds": [0, 1, 2, 3],
        "success_rate": wins / 4,
        "provenance": {"command": command, "threads": 1, "dataset": {"sha256": sha}},
    }


def _error(capsys, argv) -> str:
    """The one line ``vla`` prints for a refused command (exit 1)."""
    capsys.readouterr()
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar, if any
    assert err.startswith("vla study: error: "), err
    return err


# --- a changed study file: named and refused, never reused under the new settings ------------------------------


CHANGES = {  # an edit of the study file -> how the refusal names it, and how many of the six runs it changes
    "steps": ("train: [--steps=2]", "train: [--steps=3]", "training arguments --steps=2 are now --steps=3", 6),
    "tokenizer-option": (
        "fast: [--tokenizer.type=fast]",
        "fast: [--tokenizer.type=fast, --tokenizer.scale=20]",
        "training arguments (none) are now --tokenizer.scale=20",
        3,
    ),
    "episodes": ("episodes: 2", "episodes: 3", "evaluation episodes 2 is now 3", 6),
    "eval-args": ("args: [--max-steps, '6']", "args: [--max-steps, '9']", "evaluation args ['--max-steps', '6']", 6),
    "threads": ("name: faults", "name: faults\nthreads: 2", "threads 1 are now 2", 6),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_study_file_is_named_and_refused(fake, capsys, change):
    old, new, message, n_changed = CHANGES[change]
    before = fake.runs_json.read_bytes()
    fake.path.write_text(fake.path.read_text().replace(old, new))
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    first = "default-bin-s0" if n_changed == 6 else "default-fast-s0"
    assert f"run {first}: {message}" in err and f"({n_changed} changed run(s))" in err and "--rerun-changed" in err
    assert fake.runs_json.read_bytes() == before and not fake.work.exists()
    assert cli(["study", "run", str(fake.path), "--dry-run", *fake.args]) == 0
    assert capsys.readouterr().out.count(f"changed: {message}") == n_changed
    assert len(finished(load_study(fake.path), fake.work, fake.results)) == 6 - n_changed


def test_a_changed_base_config_is_named(fake, capsys, tmp_path):
    config = tmp_path / "base.yaml"
    shutil.copy(ROOT / "configs" / "debug.yaml", config)
    fake.path.write_text(fake.path.read_text().replace("configs/debug.yaml", str(config)))
    study = load_study(fake.path)
    records = [_record(study, run, wins=2, sha=fake.sha) for run in study.runs()]
    shutil.rmtree(fake.results)
    write_results(study, records, fake.results, {"sha256": fake.sha})
    config.write_text(config.read_text() + "\nbatch_size: 3\n")
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    assert f"the base config {config} has changed since it was trained" in err and not fake.work.exists()


def test_a_finished_run_records_what_it_was_started_with(fake):
    """The base config edited while a run trains: its record keeps the identity it started under (identity.json),
    so the next ``vla study run`` names the change instead of counting the run as done under the new file."""
    from vla.run_folder import StudyRunFolder
    from vla.study.runner import execute

    run = fake.study.runs()[0]
    place = StudyRunFolder(fake.work / run.id)
    started = {**identity(fake.study, run), "config_sha256": "0" * 64}  # the config as it was when training began
    place.train.policy.mkdir(parents=True)  # trained and evaluated: execute only writes the record
    place.train.config.write_text(json.dumps({"seed": run.seed}))
    place.eval_info.parent.mkdir(parents=True)
    place.eval_info.write_text(json.dumps({"success_rate": 0.5, "successes": [True, False], "seeds": [0, 1]}))
    place.identity.write_text(json.dumps(started))
    record = execute(fake.study, run, place.path, {"sha256": fake.sha})
    assert record["identity"] == started != identity(fake.study, run)


def test_a_run_folder_started_under_other_settings_is_not_resumed(fake, capsys):
    """A folder from before identity.json: its log's vla train line says what it was started with."""
    folder = fake.work / "default-bin-s0"
    (folder / "train").mkdir(parents=True)
    cmd = train_command(fake.study, fake.study.runs()[0], folder)
    (folder / "log.txt").write_text(f"$ {' '.join(cmd)}\n")
    fake.path.write_text(fake.path.read_text().replace("--steps=2", "--steps=5"))
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    assert "run default-bin-s0: training arguments --steps=2 are now --steps=5" in err
    assert sorted(p.name for p in fake.work.iterdir()) == ["default-bin-s0"] and (folder / "train").is_dir()


def test_records_written_by_the_runner_before_identities_still_count(tmp_path, capsys):
    """results/demo_seeds/runs.json as committed: every run finished against its own study file, and a changed
    evaluation named."""
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(ROOT / "results" / "demo_seeds" / "runs.json", results / "runs.json")
    study = load_study(ROOT / "configs" / "studies" / "demo_seeds.yaml")
    assert len(finished(study, tmp_path / "work", results)) == len(study.runs()) == 12
    args = ["--work", str(tmp_path / "work"), "--results", str(results)]
    assert cli(["study", "run", str(ROOT / "configs" / "studies" / "demo_seeds.yaml"), "--dry-run", *args]) == 0
    assert capsys.readouterr().out.count("(finished)") == 12
    changed = tmp_path / "demo_seeds.yaml"
    text = (ROOT / "configs" / "studies" / "demo_seeds.yaml").read_text()
    changed.write_text(text.replace("episodes: 50", "episodes: 100"))
    assert finished(load_study(changed), tmp_path / "work", results) == []
    assert cli(["study", "run", str(changed), "--dry-run", *args]) == 0
    assert capsys.readouterr().out.count("changed: evaluation episodes 50 is now 100") == 12


# --- records: only ever added, a backup before anything is replaced --------------------------------------------


def test_a_removed_seed_keeps_its_records_and_the_old_file(fake, capsys):
    before = json.loads(fake.runs_json.read_text())
    fake.path.write_text(fake.path.read_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1]"))
    assert cli(["study", "run", str(fake.path), *fake.args]) == 0
    after = json.loads(fake.runs_json.read_text())
    assert [r["id"] for r in after["runs"]] == [r["id"] for r in before["runs"] if not r["id"].endswith("s2")]
    assert [r["id"] for r in after["earlier_runs"]] == ["default-bin-s2", "default-fast-s2"]
    assert after["earlier_runs"] == [r for r in before["runs"] if r["id"].endswith("s2")]  # kept as they were
    backups = list(fake.results.glob("runs.json.*.bak"))
    assert len(backups) == 1 and json.loads(backups[0].read_text()) == before
    assert "keeps 2 record(s)" in (fake.results / "README.md").read_text()
    assert not (fake.work / LOCK_FILE).exists()


def test_rerun_changed_keeps_the_old_records_and_folders(fake, capsys):
    """--rerun-changed trains the changed runs again (here their training fails at once: the dataset is a stand-in);
    before that, their records move to earlier_runs with a backup of the old file, their folders aside."""
    before = json.loads(fake.runs_json.read_text())
    (fake.work / "default-fast-s0").mkdir(parents=True)
    (fake.work / "default-fast-s0" / "identity.json").write_text(json.dumps(before["runs"][1]["identity"]))
    fake.path.write_text(
        fake.path.read_text()
        .replace("seeds: [0, 1, 2]", "seeds: [0]")
        .replace("fast: [--tokenizer.type=fast]", "fast: [--tokenizer.type=fast, --tokenizer.scale=20]")
    )
    assert _error(capsys, ["study", "run", str(fake.path), *fake.args]).count("--rerun-changed") == 1
    assert json.loads(fake.runs_json.read_text()) == before
    assert list(fake.work.iterdir()) == [fake.work / "default-fast-s0"]
    err = _error(capsys, ["study", "run", str(fake.path), "--rerun-changed", *fake.args])
    assert "run default-fast-s0: train failed" in err
    after = json.loads(fake.runs_json.read_text())
    assert [r["id"] for r in after["runs"]] == ["default-bin-s0"]  # the changed run has no record under the new file
    assert after["earlier_runs"] == before["runs"][1:]  # every other record kept as it was
    assert [json.loads(p.read_text()) for p in fake.results.glob("runs.json.*.bak")] == [before]
    aside = [p.name for p in fake.work.iterdir() if p.name.startswith("default-fast-s0.changed-")]
    assert len(aside) == 1 and (fake.work / aside[0] / "identity.json").is_file()


def test_a_name_that_leaves_the_results_folder_is_refused(fake, capsys, tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("the project's page\n")
    monkeypatch.chdir(project)
    fake.path.write_text(
        fake.path.read_text()
        .replace("name: faults", 'name: ".."')
        .replace("configs/debug.yaml", str(ROOT / "configs" / "debug.yaml"))
    )
    err = _error(capsys, ["study", "run", str(fake.path), "--allow-dirty"])
    assert "'name' = '..' is invalid" in err
    fake.path.write_text(fake.path.read_text().replace('name: ".."', "name: faults"))
    err = _error(capsys, ["study", "run", str(fake.path), "--results", ".", "--allow-dirty"])
    assert "holds README.md but no runs.json" in err
    assert sorted(p.name for p in project.iterdir()) == ["README.md"]
    assert (project / "README.md").read_text() == "the project's page\n"


def test_another_studys_results_folder_is_refused(fake, capsys, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(ROOT / "results" / "demo_seeds" / "runs.json", other / "runs.json")
    before = (other / "runs.json").read_bytes()
    argv = ["study", "run", str(fake.path), "--work", str(fake.work), "--results", str(other), "--allow-dirty"]
    err = _error(capsys, argv)
    assert "holds study 'demo_seeds', not 'faults'" in err
    assert (other / "runs.json").read_bytes() == before and sorted(p.name for p in other.iterdir()) == ["runs.json"]


@pytest.mark.parametrize("damage", ["truncated", "list", "no id", "no setting", "string successes", "study key"])
def test_a_broken_runs_json_is_refused_never_replaced(fake, capsys, damage):
    text = fake.runs_json.read_text()
    data = json.loads(text)
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "list":
        text = json.dumps(data["runs"])
    else:
        if damage == "no id":
            del data["runs"][1]["id"]
        elif damage == "no setting":
            del data["runs"][1]["setting"]
        elif damage == "string successes":
            data["runs"][1]["successes"] = "1101"
        else:
            data["study"]["colour"] = "red"
        text = json.dumps(data)
    fake.runs_json.write_text(text)
    expected = {
        "truncated": "cannot be read",
        "list": "is not a study's runs.json",
        "no id": "'id' = None is not a name",
        "no setting": "'setting' = None is not a name",
        "string successes": "'successes' = '1101' is not a list of true/false",
        "study key": "unknown key(s) ['colour']",
    }[damage]
    for argv in (["study", "run", str(fake.path), *fake.args], ["study", "table", str(fake.results)]):
        err = _error(capsys, argv)
        assert expected in err, err
        assert fake.runs_json.read_text() == text and not fake.work.exists()
    assert sorted(p.name for p in fake.results.iterdir()) == ["README.md", "runs.json", "success.png"]


def test_table_names_a_missing_or_foreign_runs_json(capsys, tmp_path):
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        err = _error(capsys, ["study", "table", str(folder)])
        assert f"no runs.json in {folder}" in err and "vla study run" in err and "save_pretrained" not in err
    assert not (tmp_path / "missing").exists() and list((tmp_path / "empty").iterdir()) == []
    foreign = tmp_path / "aloha"
    foreign.mkdir()
    shutil.copy(ROOT / "results" / "aloha" / "runs.json", foreign / "runs.json")
    err = _error(capsys, ["study", "table", str(foreign)])
    assert "is not a study's runs.json" in err and sorted(p.name for p in foreign.iterdir()) == ["runs.json"]


def test_a_broken_evaluation_keeps_the_runs_record(fake, capsys):
    folder = fake.work / "default-bin-s0"
    (folder / "train" / "policy").mkdir(parents=True)
    (folder / "train" / "train_config.json").write_text("{}")
    (folder / "eval").mkdir()
    (folder / "eval" / "eval_info.json").write_text('{"success_rate": 0.5, "succ')
    before = json.loads(fake.runs_json.read_text())["runs"]
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    assert "eval_info.json cannot be read" in err and "delete it and run the study again" in err
    assert json.loads(fake.runs_json.read_text())["runs"] == before  # the run's valid record stays


def test_a_cell_trained_on_two_datasets_is_marked_mixed(fake, capsys):
    data = json.loads(fake.runs_json.read_text())
    data["runs"][2]["provenance"]["dataset"]["sha256"] = "b" * 64  # default-bin-s1
    fake.runs_json.write_text(json.dumps(data))
    assert cli(["study", "table", str(fake.results)]) == 0
    page = (fake.results / "README.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| default | bin |"))
    assert "mixed data: 2 datasets, not a verdict" in row
    summary = json.loads(fake.runs_json.read_text())
    assert summary["cells"][0]["mixed"] and summary["comparisons"][0]["p_value"] is None
    assert "mixes runs trained on different datasets" in summary["comparisons"][0]["why"]


# --- one study per folder, children ended with it ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["work", "results"])
def test_a_second_study_run_in_a_folder_is_refused(fake, capsys, where):
    """A study run holds its work folder (where its trainers write) and its results folder (runs.json)."""
    folder = fake.work if where == "work" else fake.results
    folder.mkdir(exist_ok=True)
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "started": "now", "command": ["vla"], "children": []}
    (folder / LOCK_FILE).write_text(json.dumps(lock))
    before = fake.runs_json.read_bytes()
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    assert f"{folder} is in use by another vla study run (pid {os.getpid()} on {socket.gethostname()}" in err
    assert f"kill {os.getpid()}" in err and fake.runs_json.read_bytes() == before
    assert json.loads((folder / LOCK_FILE).read_text()) == lock and not (fake.work / "default-bin-s0").exists()


def test_a_stale_lock_is_taken_over_unless_its_child_still_runs(fake, capsys):
    dead = subprocess.Popen(["true"])
    dead.wait()
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        fake.work.mkdir()
        lock = {"pid": dead.pid, "host": socket.gethostname(), "started": "then", "children": [child.pid]}
        (fake.work / LOCK_FILE).write_text(json.dumps(lock))
        err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
        assert f"child process group {child.pid} still runs there; stop it (kill -- -{child.pid})" in err
        assert child.poll() is None  # refused, not killed: it is not this run's child
    finally:
        child.kill()
        child.wait()
    capsys.readouterr()
    assert cli(["study", "run", str(fake.path), *fake.args]) == 0
    assert "taking over the lock of a study run that stopped" in capsys.readouterr().out
    assert not (fake.work / LOCK_FILE).exists()


def test_sigterm_ends_the_training_child_and_releases_the_lock(tiny_dataset_root, tmp_path):
    path = tmp_path / "long.yaml"
    text = _study_text(tiny_dataset_root, steps=100000, seeds="[0]", name="long", extra="workers: 1\n")
    path.write_text(text.replace("--steps=100000", "--steps=100000, --policy.preset=micro"))
    work = tmp_path / "work"
    argv = ["study", "run", str(path), "--work", str(work), "--results", str(tmp_path / "results"), "--allow-dirty"]
    parent = subprocess.Popen(
        [sys.executable, "-m", "vla.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline, group = time.monotonic() + 120, None
        while group is None and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.5)
            try:
                group = (json.loads((work / LOCK_FILE).read_text())["children"] or [None])[0]
            except (OSError, ValueError):
                pass
        assert group is not None, parent.communicate(timeout=30)
        time.sleep(1.0)
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 1 and "stopped by SIGTERM" in err
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # the trainer's whole process group is gone
    assert not (work / LOCK_FILE).exists() and not (tmp_path / "results" / "runs.json").exists()


# --- checked when the file is read, before anything trains -------------------------------------------------------


MISTAKES = {  # a mistake in the study file: (what it replaces, with what, how the refusal names it)
    "duplicate-key": ("name: faults", "name: faults\nname: other", "key 'name' appears twice"),
    "eval-typo": ("episodes: 2,", "episodes: 2, arg: [--num-envs, '2'],", "unknown key(s) ['arg'] in 'eval'"),
    "env": ("env: metaworld", "env: metaword", "eval env 'metaword'"),
    "task": ("task: push-v3", "task: psuh-v3", "task 'psuh-v3'"),
    "bool-seed": ("seeds: [0, 1, 2]", "seeds: [true, 0, 2]", "'seeds' = [True, 0, 2] is invalid"),
    "negative-seed": ("seeds: [0, 1, 2]", "seeds: [-1, 0, 1]", "'seeds' = [-1, 0, 1] is invalid"),
    "dataset-root": (
        "--tokenizer.n_bins=32",
        "--tokenizer.n_bins=32, --dataset_root=/elsewhere",
        "--dataset_root is set by the study runner",
    ),
    "output-dir": (
        "--tokenizer.type=fast]",
        "--tokenizer.type=fast, --output-dir=x]",
        "--output_dir is set by the study runner",
    ),
    "eval-policy": ("args: [--max-steps, '6']", "args: [--policy, other]", "--policy is set by the study runner"),
    "eval-unknown": ("args: [--max-steps, '6']", "args: [--numenvs, '2']", "'--numenvs' is no vla eval argument"),
    "eval-value": ("args: [--max-steps, '6']", "args: [--max-steps, six]", "are not vla eval arguments"),
    "train-typo": ("--tokenizer.type=fast]", "--tokenizer.type=fast, --tokenizer.scal=3]", "do not parse"),
    "config": ("config: configs/debug.yaml", "config: configs/nothing.yaml", "configs/nothing.yaml does not exist"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_mistakes_are_refused_before_anything_trains(fake, capsys, mistake):
    old, new, message = MISTAKES[mistake]
    assert old in fake.path.read_text()
    fake.path.write_text(fake.path.read_text().replace(old, new))
    before = fake.runs_json.read_bytes()
    err = _error(capsys, ["study", "run", str(fake.path), *fake.args])
    assert message in err, err
    assert fake.runs_json.read_bytes() == before and not fake.work.exists()
