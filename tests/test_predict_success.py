"""scripts/predict_success.py, a cheap predictor of closed-loop success: the rank correlations and their bootstrap
interval, the collapse measure, the reading of study records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def ps():
    spec = importlib.util.spec_from_file_location("predict_success", REPO / "scripts" / "predict_success.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rowwise_spearman_is_scipys_on_every_row_ties_included(ps):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, size=(50, 9)).astype(float)  # many ties
    y = rng.normal(size=(50, 9))
    y[:, :3] = 0.5  # ties in y as well
    got = ps.rowwise_spearman(x, y)
    want = [spearmanr(a, b).statistic for a, b in zip(x, y)]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.isnan(ps.rowwise_spearman(np.ones((1, 5)), np.arange(5.0)[None]))[0]  # no spread: undefined


def test_a_monotone_relation_has_rho_one_and_a_degenerate_interval(ps):
    x = np.arange(10.0)
    r = ps.spearman_interval(x, np.exp(x))  # monotone, not linear: rank correlation exactly 1
    assert r["rho"] == pytest.approx(1.0)
    assert r["lo"] == pytest.approx(1.0) and r["hi"] == pytest.approx(1.0)
    assert r["n"] == 10
    r = ps.spearman_interval(x, -(x**3))
    assert r["rho"] == pytest.approx(-1.0) and r["hi"] == pytest.approx(-1.0)


def test_the_interval_covers_the_truth_and_narrows_with_more_cells(ps):
    """A noisy monotone relation: rho near its population value, inside the interval, and the interval narrower
    for 200 cells than for 12; the same seed gives the same interval."""
    rng = np.random.default_rng(0)

    def cells(n):
        x = rng.normal(size=n)
        return x, x + 0.5 * rng.normal(size=n)  # population Spearman ~0.88

    small, large = ps.spearman_interval(*cells(12)), ps.spearman_interval(*cells(200))
    for r in (small, large):
        assert r["lo"] <= r["rho"] <= r["hi"]
    assert 0.8 < large["rho"] < 0.95
    assert (large["hi"] - large["lo"]) < (small["hi"] - small["lo"])
    x, y = cells(12)
    assert ps.spearman_interval(x, y) == ps.spearman_interval(x, y)


def test_predicts_needs_the_bar_and_the_expected_sign(ps):
    assert ps.predicts({"rho": -0.85}, -1)
    assert not ps.predicts({"rho": 0.85}, -1)  # an error rising with success is no predictor
    assert not ps.predicts({"rho": -0.79}, -1)
    assert ps.predicts({"rho": -0.9}, 0) and ps.predicts({"rho": 0.9}, 0)
    assert not ps.predicts({"rho": float("nan")}, 1)


def test_collapse_is_the_spread_ratio_per_dimension_and_its_smallest(ps):
    demo = np.array([[0.0, 1.0, 0.2], [1.0, -1.0, 0.2], [2.0, 0.0, 0.2], [3.0, 2.0, 0.2]])  # [E=4, D=3]
    same = ps.collapse(demo.copy(), demo)
    assert same["ratio_per_dim"][:2] == pytest.approx([1.0, 1.0])
    assert same["ratio_per_dim"][2] is None  # the expert holds it constant: no spread to compare with
    half = demo * np.array([0.5, 1.0, 1.0]) + 7.0  # half the spread on dim 0; an offset changes no spread
    assert ps.collapse(half, demo)["ratio_per_dim"][:2] == pytest.approx([0.5, 1.0])
    assert ps.collapse(half, demo)["min"] == pytest.approx(0.5)
    collapsed = np.tile(demo.mean(0), (4, 1))  # one action whatever the scene
    assert ps.collapse(collapsed, demo)["min"] == 0.0


def test_action_rmse_leaves_out_steps_past_the_end(ps):
    target = np.zeros((2, 3, 2))
    pred = np.ones((2, 3, 2))
    pred[:, 2] = 100.0  # only past the end
    inside = np.array([[True, True, False], [True, True, False]])
    assert ps.action_rmse(pred, target, inside) == pytest.approx(1.0)
    pred[0, 0, 1] = 3.0
    want = np.mean([1.0, np.sqrt((1 + 9 + 1 + 1) / 4)])  # per dimension, then the mean over dimensions
    assert ps.action_rmse(pred, target, inside) == pytest.approx(want)


def run_record(run_id, tokenizer, seed, success, loss, command):
    return {
        "id": run_id,
        "tokenizer": tokenizer,
        "setting": "s",
        "seed": seed,
        "success_rate": success,
        "final_loss": loss,
        "tokens_per_chunk": 5.0,
        "episode_seeds": [1000000, 1000001],
        "provenance": {"command": command},
    }


def write_study(root, name, task, runs, images=False):
    study = {"name": name, "dataset": f"outputs/datasets/{name}", "eval": {"task": task}, "record": []}
    study["record"] += ["--images"] if images else []
    (root / name).mkdir(parents=True)
    (root / name / "runs.json").write_text(json.dumps({"study": study, "runs": runs}))


def test_runs_are_read_once_each_with_a_running_studys_finished_runs(ps, tmp_path):
    """A training two studies share counts once (kept under the first, the second named in ``also_in``); a finished
    run of a running study (its ``run.json``) joins; a results file of another format is skipped."""
    results, work = tmp_path / "results", tmp_path / "work"
    a = [run_record(f"r{i}", "bin" if i % 2 else "fast", i, i / 10, 0.1 * i, ["train", str(i)]) for i in range(5)]
    write_study(results, "alpha", "push-v3", a, images=True)
    write_study(results, "beta", "push-v3", [a[0], run_record("x", "fsq", 0, 0.5, 0.3, ["other"])])
    (results / "gamma").mkdir()
    (results / "gamma" / "runs.json").write_text(json.dumps({"runs": [{"name": "not a study run"}]}))
    (work / "beta" / "late").mkdir(parents=True)
    (work / "beta" / "late" / "run.json").write_text(json.dumps(run_record("late", "fsq", 1, 0.9, 0.2, ["late"])))

    cells = ps.read_runs(results, work)
    assert [(c["study"], c["id"]) for c in cells] == [("alpha", f"r{i}") for i in range(5)] + [
        ("beta", "x"),
        ("beta", "late"),
    ]
    assert cells[0]["also_in"] == ["beta"]
    assert cells[0]["observation"] == "pixels" and cells[-1]["observation"] == "state"
    assert cells[0]["eval_tokens_per_chunk"] == 5.0 and cells[0]["eval_seeds"] == [1000000, 1000001]

    pools = ps.pools(cells)
    assert len(pools["study alpha"]) == 5
    assert "study beta" not in pools  # 3 runs: too few for a correlation
    assert len(pools["push-v3"]) == 7
    assert "push-v3 from pixels" not in pools  # the same runs as study alpha


def test_correlations_give_a_row_per_pool_and_quantity_and_the_tokenizer_reference(ps, tmp_path):
    results = tmp_path / "results"
    runs = [run_record(f"r{i}", "bin" if i < 3 else "fast", i, i / 10, 1.0 - i / 10, [str(i)]) for i in range(6)]
    write_study(results, "alpha", "push-v3", runs)
    cells = ps.read_runs(results, None)
    rows = {(r["pool"], r["quantity"]): r for r in ps.correlations(cells, ["final_loss"])}
    loss = rows[("study alpha", "final_loss")]
    assert loss["rho"] == pytest.approx(-1.0) and loss["predicts"] and loss["n"] == 6
    assert loss["within_rho"] == pytest.approx(-1.0) and loss["within_groups"] == 2
    reference = rows[("study alpha", "tokenizer_only")]
    assert not reference["predicts"]  # a reference, never a candidate
