"""Every results file says what produced it; the fingerprint tells datasets apart."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vla.provenance import REQUIRED, check, dataset_fingerprint, git_state, provenance

RESULTS = Path(__file__).resolve().parent.parent / "results"
UNTRACED = RESULTS / "UNTRACED.txt"


def test_the_block_names_code_data_settings_and_numerics(tiny_dataset_root):
    block = provenance(config={"steps": 3}, dataset=tiny_dataset_root, seed=7)
    assert all(key in block for key in REQUIRED) and block["config"] == {"steps": 3} and block["seed"] == 7
    assert block["threads"] >= 1 and "torch" in block["packages"] and "numpy" in block["packages"]
    assert (
        isinstance(block["processor"], str) and block["processor"]
    )  # speed figures are comparable only on one CPU model
    assert block["dataset"]["files"] > 0 and check({"provenance": block}) == []
    assert check({"success_rate": 1.0}) == ["no 'provenance' block"]
    assert check({"provenance": {"commit": "abc"}})[0] == "provenance lacks 'format'"


def test_the_fingerprint_changes_with_any_file(tiny_dataset_root, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dataset_root, copy)
    assert dataset_fingerprint(copy)["sha256"] == dataset_fingerprint(tiny_dataset_root)["sha256"]
    original = dataset_fingerprint(tiny_dataset_root)["sha256"]
    info = copy / "meta" / "info.json"
    values = json.loads(info.read_text())
    info.write_text(json.dumps(dict(reversed(list(values.items()))), indent=1))  # same values, other order and spacing
    assert dataset_fingerprint(copy)["sha256"] == original
    info.write_text(json.dumps({**values, "fps": values["fps"] + 1}))
    assert dataset_fingerprint(copy)["sha256"] != original
    info.write_text(json.dumps(values))
    parquet = next((copy / "data").rglob("*.parquet"))
    parquet.write_bytes(parquet.read_bytes() + b"\0")
    assert dataset_fingerprint(copy)["sha256"] != original
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dataset_fingerprint(tmp_path / "nowhere")


def _committed_results() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.json"], cwd=RESULTS, capture_output=True, text=True, check=True)
        return [RESULTS / line for line in out.stdout.split()]
    except (OSError, subprocess.CalledProcessError):  # not a checkout: every file there
        return sorted(RESULTS.rglob("*.json"))


def test_committed_results_say_what_produced_them():
    untraced = {line.strip() for line in UNTRACED.read_text().splitlines() if line.strip() and not line.startswith("#")}
    lacking = {}
    for path in _committed_results():
        name = path.relative_to(RESULTS).as_posix()
        problems = check(json.loads(path.read_text()))
        if problems and name not in untraced:
            lacking[name] = problems
        if not problems and name in untraced:
            lacking[name] = ["has provenance now: remove it from results/UNTRACED.txt"]
    assert not lacking, f"results files without a complete provenance block: {lacking}"
    missing = sorted(n for n in untraced if not (RESULTS / n).is_file())
    assert not missing, f"results/UNTRACED.txt lists files that are gone (remove the lines): {missing}"


def test_committed_gifs_stay_small():
    """A results folder carries a GIF only as an illustration: at most 300 kB each."""
    try:
        out = subprocess.run(["git", "ls-files", "*.gif"], cwd=RESULTS, capture_output=True, text=True, check=True)
        gifs = [RESULTS / line for line in out.stdout.split()]
    except (OSError, subprocess.CalledProcessError):
        gifs = sorted(RESULTS.rglob("*.gif"))
    big = {p.relative_to(RESULTS).as_posix(): p.stat().st_size for p in gifs if p.stat().st_size > 300_000}
    assert not big, f"GIFs above 300 kB (keep fewer frames or colours): {big}"


def test_the_command_names_no_machine_folder(tmp_path):
    from vla.provenance import portable_command

    here = tmp_path / "vla"
    argv = [str(here / "vla" / "cli.py"), "study", "run", f"--out={here / 'results'}", str(tmp_path / "old"), "-x"]
    assert portable_command(argv, here) == ["vla/cli.py", "study", "run", "--out=results", "../old", "-x"]
    assert not any(
        arg.partition("=")[2 if arg.startswith("--") else 0].startswith("/")
        for arg in provenance(command=argv)["command"]
    )
    console = [str(Path(sys.prefix, "bin", "vla")), "train", f"--dataset_root={here / 'data'}"]
    assert portable_command(console, tmp_path / "elsewhere") == ["vla", "train", "--dataset_root=../vla/data"]
    relative = [os.path.relpath(console[0], tmp_path), "train"]  # the environment's program, reached from beside it
    assert relative[0].startswith("..") and portable_command(relative, tmp_path) == ["vla", "train"]


def test_dirty_means_code_changed_not_results_or_pages(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    files = {"train.py": "x = 1\n", "results/bench.json": "{}\n", "README.md": "# a\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert git_state(tmp_path)[1] is False
    (tmp_path / "results/bench.json").write_text('{"p50": 1}\n')  # a benchmark rewrote its own results file
    (tmp_path / "README.md").write_text("# b\n")
    assert git_state(tmp_path)[1] is False
    (tmp_path / "train.py").write_text("x = 2\n")
    commit, dirty = git_state(tmp_path)
    assert dirty is True and len(commit) == 40


def test_a_loaded_machine_never_writes_a_headline_figure(tmp_path, capsys):
    from vla.provenance import QUIET_EXTRA_LOAD, headline_path, quiet_machine

    quiet = quiet_machine([0.7, 1.2, 1.4], threads=1)
    loaded = quiet_machine([0.7, 1.2 + QUIET_EXTRA_LOAD + 0.5], threads=1)
    assert quiet["quiet"] and not loaded["quiet"] and loaded["max_load"] == 2.2
    assert quiet_machine([3.0], threads=2)["quiet"] is False and not quiet_machine([], threads=1)["quiet"]
    out = tmp_path / "bench.json"
    assert headline_path(out, quiet, allow_loaded=False) == out
    assert headline_path(out, loaded, allow_loaded=False) == tmp_path / "bench.loaded.json"
    assert "the machine was loaded (1-minute load up to 2.20" in capsys.readouterr().out
    assert headline_path(out, loaded, allow_loaded=True) == out  # recorded as the headline only when asked
