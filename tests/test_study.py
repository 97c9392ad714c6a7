"""Closed-loop studies: the statistics, the study file's checks, and a micro study run end to end, stopped and
resumed; determinism (same seed, threads and data: the same weights and the same evaluation)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import assert_plot
from vla.cli import build_parser
from vla.cli import main as cli
from vla.sim import env_names
from vla.study import aggregate, compare, load_study, wilson
from vla.study.report import rewrite
from vla.study.runner import run_study

MICRO = [
    "--policy.preset=micro",
    "--policy.time_horizon=4",
    "--policy.n_action_steps=2",
    "--batch_size=4",
    "--steps=2",
    "--save_every=1",
    "--log_every=1",
    "--policy.scheduler_warmup_steps=1",
    "--policy.scheduler_decay_steps=2",
]


def test_wilson_matches_the_closed_form():
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)  # the textbook value for 5 of 10
    assert wilson(0, 10)[0] == 0.0 and 0.27 < wilson(0, 10)[1] < 0.28
    assert wilson(10, 10)[1] == 1.0 and 0.72 < wilson(10, 10)[0] < 0.73
    # about +-14 points at 50% over 50 episodes, +-10 over 100
    assert abs((wilson(25, 50)[1] - wilson(25, 50)[0]) / 2 - 0.135) < 0.01
    assert abs((wilson(50, 100)[1] - wilson(50, 100)[0]) / 2 - 0.096) < 0.01
    with pytest.raises(ValueError, match="successes <= n"):
        wilson(11, 10)


def test_aggregate_and_compare_use_the_seeds():
    runs = [{"seed": s, "successes": [True] * k + [False] * (10 - k)} for s, k in enumerate([4, 10, 7])]
    cell = aggregate(runs)
    assert cell["rates"] == [0.4, 1.0, 0.7] and math.isclose(cell["mean"], 0.7)
    assert math.isclose(cell["std"], np.std([0.4, 1.0, 0.7], ddof=1)) and cell["min"] == 0.4
    assert cell["episodes"] == 30 and cell["wilson95"][0] < 0.7 < cell["wilson95"][1]
    # A 40-100% spread makes a 10-point gap noise; a steady 30-point gap over three seeds is not.
    other = aggregate([{"seed": s, "successes": [True] * k + [False] * (10 - k)} for s, k in enumerate([6, 6, 6])])
    assert not compare(cell, other)["significant"]
    steady_hi = aggregate([{"seed": s, "successes": [True] * k + [False] * (10 - k)} for s, k in enumerate([9, 9, 10])])
    steady_lo = aggregate([{"seed": s, "successes": [True] * k + [False] * (10 - k)} for s, k in enumerate([6, 6, 7])])
    verdict = compare(steady_hi, steady_lo)
    assert verdict["significant"] and verdict["p_value"] < 0.05 and math.isclose(verdict["gap"], 0.3)
    assert compare(aggregate(runs[:1]), other)["p_value"] is None  # one seed: no verdict
    # two seeds (fewer than a verdict needs, as the page's table says) give no verdict, however far apart
    two_hi, two_lo = (
        aggregate([{"seed": s, "successes": [True] * k + [False] * (10 - k)} for s, k in enumerate(ks)])
        for ks in ([8, 9], [2, 2])
    )
    assert compare(two_hi, two_lo)["p_value"] is None and "fewer than 3 seeds" in compare(two_hi, two_lo)["why"]


def test_cells_whose_seeds_agree_are_compared_over_their_episodes():
    """Every seed of both cells at one rate leaves no seed spread to test against (Welch's t would be infinite):
    a 2-point gap at saturation is no verdict, a 100-point one still is."""

    def cell(k, n=50):
        return aggregate([{"seed": s, "successes": [True] * k + [False] * (n - k)} for s in range(3)])

    near = compare(cell(50), cell(49))
    assert not near["significant"] and near["p_value"] > 0.2 and near["test"] == "fisher"  # 150 / 150 against 147 / 150
    far = compare(cell(50), cell(0))
    assert far["significant"] and far["p_value"] < 1e-6


def _write(path, text):
    path.write_text(text)
    return path


def test_study_file_errors_name_the_key(tmp_path):
    good = "name: s\ndataset: d\nconfig: c.yaml\ntokenizers: {fast: []}\nseeds: [0, 1, 2]\neval: {episodes: 5}\n"
    assert load_study(_write(tmp_path / "ok.yaml", good)).runs()[0].id == "default-fast-s0"
    cases = {
        good + "colour: red\n": "unknown key",
        good.replace("seeds: [0, 1, 2]", "seeds: [0, 0]"): "'seeds'",
        good.replace("{fast: []}", "{fast: [--seed=3]}"): "--seed is set by the study runner",
        good.replace("episodes: 5", "episodes: 0"): "'eval'",
        "name: s\n": "missing key",
        "name: [\n": "not valid YAML",
    }
    for i, (text, message) in enumerate(cases.items()):
        with pytest.raises(ValueError, match=message):
            load_study(_write(tmp_path / f"bad{i}.yaml", text))
    assert cli(["study", "run", str(tmp_path / "missing.yaml")]) == 1


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[1] / "configs" / "studies").glob("*.yaml")), ids=lambda p: p.stem
)
def test_committed_studies_record_and_evaluate_environments_that_exist(path):
    study = load_study(path)
    if study.record is not None:  # what the runner passes to `vla data record` when the dataset is missing
        args = build_parser(["data"]).parse_args(["data", "record", *study.record, "--root", "unused"])
        assert env_names(f"{args.env}/{args.task}")
    assert env_names(f"{study.eval['env']}/{study.eval['task']}")


def test_a_micro_study_runs_stops_and_resumes(tiny_dataset_root, tmp_path):
    study_file = _write(
        tmp_path / "micro.yaml",
        f"""
name: micro
dataset: {tiny_dataset_root}
config: configs/debug.yaml
train: {json.dumps(MICRO)}
tokenizers: {{fast: [--tokenizer.type=fast, --tokenizer.vocab_size=256], bin: [--tokenizer.type=bin, --tokenizer.n_bins=32, --heldout_episodes=0.25, --report_chunks=8]}}
seeds: [0]
eval: {{env: metaworld, task: push-v3, episodes: 2, args: [--max-steps, "6", --num-envs, "2"]}}
workers: 2
""",
    )
    study = load_study(study_file)
    work, results = tmp_path / "work", tmp_path / "results"
    summary = run_study(study, work=work, results=results, allow_dirty=True, progress=False)
    assert [r["id"] for r in summary["runs"]] == ["default-fast-s0", "default-bin-s0"]
    run = summary["runs"][0]
    assert len(run["successes"]) == 2 and run["episode_seeds"] == [1_000_000, 1_000_001]
    block = run["provenance"]
    assert block["threads"] == 1 and len(block["commit"]) in (7, 40) or block["commit"] == "unknown"
    assert block["dataset"]["files"] > 0 and len(block["dataset"]["sha256"]) == 64
    assert block["config"]["seed"] == 0 and block["config"]["steps"] == 2 and run["train_wall_s"] > 0
    assert "--tokenizer.n_bins=32" in summary["runs"][1]["provenance"]["command"]
    # A run that held episodes out records its offline report's measures beside its success; one that did not, none.
    offline = json.loads((work / "default-bin-s0" / "train" / "offline_report.json").read_text())
    assert summary["runs"][1]["offline"]["rmse"] == offline["policy"]["rmse"] and "offline" not in run
    assert summary["runs"][1]["offline"]["first_action_rmse"] == offline["policy"]["rmse_per_step"][0]
    assert [c["tokenizer"] for c in summary["cells"]] == ["fast", "bin"] and summary["cells"][0]["seeds"] == [0]
    assert summary["comparisons"][0]["p_value"] is None  # one seed a cell: a number, not a verdict
    assert "too few seeds" in (results / "README.md").read_text()
    assert (results / "README.md").read_text().count("| default |") == 3
    assert "2 runs side by side" in (results / "README.md").read_text()
    assert_plot(results / "success.png")
    evaluation = json.loads((work / "default-bin-s0" / "eval" / "eval_info.json").read_text())
    assert evaluation["provenance"]["config"]["train"]["seed"] == 0  # vla eval's own file says what produced it

    # Stopped mid-way: one run lost its evaluation, the other its training's final policy (a checkpoint is left).
    import shutil

    for run_id in ("default-bin-s0", "default-fast-s0"):
        (work / run_id / "run.json").unlink()
    (work / "default-bin-s0" / "eval" / "eval_info.json").unlink()
    shutil.rmtree(work / "default-fast-s0" / "eval")
    shutil.rmtree(work / "default-fast-s0" / "train" / "policy")
    again = run_study(study, work=work, results=results, allow_dirty=True, progress=False)
    assert len(again["runs"]) == 2
    commands = [
        line for line in (work / "default-bin-s0" / "log.txt").read_text().splitlines() if line.startswith("$ ")
    ]
    assert [c.split(" vla.cli ")[1].split()[0] for c in commands] == ["train", "eval", "eval"]  # only the eval again
    commands = [
        line for line in (work / "default-fast-s0" / "log.txt").read_text().splitlines() if line.startswith("$ ")
    ]
    assert [c.split(" vla.cli ")[1].split()[0] for c in commands] == ["train", "eval", "train", "eval"]
    assert commands[2].endswith("--resume=true") and not commands[0].endswith("--resume=true")  # from its checkpoint
    assert rewrite(results)["cells"] == again["cells"]

    # The work folder lost (another machine): the runs reported in results/runs.json count as finished.
    shutil.rmtree(work)
    third = run_study(study, work=work, results=results, allow_dirty=True, progress=False)
    assert [r["id"] for r in third["runs"]] == ["default-fast-s0", "default-bin-s0"] and not work.joinpath(
        "default-bin-s0"
    ).exists()
    assert third["cells"] == again["cells"]


def test_same_seed_threads_and_data_give_the_same_weights_and_evaluation(tiny_dataset_root, tmp_path, one_torch_thread):
    from vla import train
    from vla.config import load_config
    from vla.evaluate import evaluate

    reports, weights = [], []
    for name in ("a", "b"):
        cfg = load_config(
            args=[
                "--config_path=configs/debug.yaml",
                f"--dataset_root={tiny_dataset_root}",
                f"--output_dir={tmp_path / name}",
                "--progress=false",
                *MICRO,
                "--steps=3",
            ]
        )
        train.main(cfg)
        weights.append(load_file(str(tmp_path / name / "policy" / "model.safetensors")))
        reports.append(
            evaluate(tmp_path / name / "policy", "metaworld/push-v3", 2, max_steps=12, num_envs=2, progress=False)
        )
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    for key in ("successes", "returns", "lengths"):
        assert reports[0][key] == reports[1][key]


def test_a_multi_task_study_pools_its_tasks_and_reports_each(tiny_dataset_root, tmp_path):
    study = load_study(
        _write(
            tmp_path / "tasks.yaml",
            f"""
name: tasks
dataset: {tiny_dataset_root}
config: configs/debug.yaml
train: {json.dumps(MICRO)}
tokenizers: {{bin: [--tokenizer.type=bin, --tokenizer.n_bins=32]}}
seeds: [0]
eval: {{env: metaworld, task: "push-v3,reach-v3", episodes: 2, args: [--max-steps, "4", --num-envs, "2"]}}
workers: 1
""",
        )
    )
    summary = run_study(study, work=tmp_path / "work", results=tmp_path / "results", allow_dirty=True, progress=False)
    run = summary["runs"][0]
    assert list(run["task_successes"]) == ["push-v3", "reach-v3"]
    assert run["successes"] == run["task_successes"]["push-v3"] + run["task_successes"]["reach-v3"]
    assert len(run["successes"]) == 4 and run["episode_seeds"] == [1_000_000, 1_000_001] * 2
    assert summary["cells"][0]["episodes"] == 4
    page = (tmp_path / "results" / "README.md").read_text()
    assert "| setting | tokenizer | push-v3 | reach-v3 |" in page
    assert "one run at a time, 1 torch thread(s) each" in page  # workers: 1


def test_the_eval_command_is_read_back_as_the_evaluation_it_was_written_from():
    """A run folder from before identity.json is judged by the ``vla eval`` line of its log: the words
    ``eval_arguments`` writes read back as the study's evaluation, and anything else as none."""
    from vla.study.spec import eval_arguments, read_eval_arguments

    ev = {"env": "metaworld", "task": "push-v3", "episodes": 100, "args": ["--max-steps", "400"]}
    words = eval_arguments(ev, "RUN/train/policy", "RUN/eval")
    assert words[:2] == ["--policy", "RUN/train/policy"] and words[-2:] == ["--max-steps", "400"]
    assert read_eval_arguments(words) == ev
    assert read_eval_arguments(words[2:]) is None  # not the runner's own flags first
    assert read_eval_arguments(words[:9]) is None  # cut short
