"""scripts/delay_table.py, success behind a network delay: every scheme a policy can use, one decode time per policy."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_plot, train_micro_policy
from vla.tokenizer_choice import tokenizer_config

REPO = Path(__file__).parents[1]


def delay_table():
    spec = importlib.util.spec_from_file_location("delay_table", REPO / "scripts" / "delay_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_policy_runs_every_scheme_it_allows_at_one_decode_time(tiny_dataset_root, tmp_path, monkeypatch):
    """A binning policy is evaluated synchronously, ahead, and ahead with its committed actions; a FAST policy that
    refuses committed actions (``commit_search`` 0) without the last. The decode measured first, without and with
    committed actions, is the one every delay of a policy uses."""
    from vla.policy import VLAPolicy

    binned = train_micro_policy(tiny_dataset_root, tmp_path / "bin", tokenizer_config("bin", n_bins=64))
    fast = VLAPolicy.from_pretrained(train_micro_policy(tiny_dataset_root, tmp_path / "fast"))
    fast.config.commit_search = 0
    fast.save_pretrained(tmp_path / "fast_refusing")
    fast = str(tmp_path / "fast_refusing")
    module = delay_table()
    out = tmp_path / "delay"
    argv = ["delay_table.py", "--policy", f"b={binned}", "--policy", f"f={fast}", "--episodes", "1"]
    monkeypatch.setattr(sys, "argv", argv + ["--max-steps", "8", "--delays", "0,25", "--out", str(out)])
    module.main()

    record = json.loads((out / "delay.json").read_text())
    schemes = {name: [r["scheme"] for r in record["rows"] if r["policy"] == name] for name in ("b", "f")}
    blended = "every decode + ensemble"
    assert schemes["b"] == ["no delay"] + ["when empty", "ahead", "ahead + commit", "every decode", blended] * 2
    assert schemes["f"] == ["no delay"] + ["when empty", "ahead", "every decode", blended] * 2
    every = [r for r in record["rows"] if r["scheme"].startswith("every decode")]
    assert all(r["every"] >= 1 for r in every) and all(r["every"] is None for r in record["rows"] if r not in every)
    assert {r["ensemble"] for r in record["rows"]} == {None, module.ACT_ENSEMBLE}
    assert all((r["ensemble"] is not None) == (r["scheme"] == blended) for r in record["rows"])
    for name in ("b", "f"):
        for commit in (False, True):
            decodes = {
                r["decode_ms"]
                for r in record["rows"]
                if r["policy"] == name and r["scheme"] != "no delay" and module.SCHEMES[r["scheme"]].commit == commit
            }
            assert len(decodes) == (0 if commit and name == "f" else 1) and all(d > 0 for d in decodes)
    decodes_b = {r["decode_ms"] for r in record["rows"] if r["policy"] == "b" and r["decode_ms"]}
    late = {(r["policy"], r["delay_ms_each_way"]): r["delay_steps"] for r in record["rows"] if r["delay_steps"]}
    assert all(late[(p, 25.0)] >= late[(p, 0.0)] + 4 for p in ("b", "f"))  # 50 ms round trip: 4 steps at 80 Hz
    committed = [c for c in record["cells"] if c["scheme"] == "ahead + commit"]
    assert [set(c["per_policy"]) for c in committed] == [{"b"}] * 2
    assert "| b | 25 ms | ahead + commit | " in (out / "README.md").read_text()
    assert record["provenance"]["config"]["episodes"] == 1
    assert_plot(out / "delay.png")

    calls = []
    evaluate = module.evaluate
    monkeypatch.setattr(module, "evaluate", lambda *a, **k: calls.append(k["delay_ms"]) or evaluate(*a, **k))
    monkeypatch.setattr(sys, "argv", argv + ["--max-steps", "8", "--delays", "0,25,50", "--out", str(out)])
    module.main()  # a longer table continues the one written: only the new delay is evaluated
    assert calls == [100.0] * 9  # 50 ms each way: bin's five schemes, FAST's four
    again = json.loads((out / "delay.json").read_text())
    assert again["rows"][: len(record["rows"])] == record["rows"] and len(again["rows"]) == len(record["rows"]) + 9
    assert {r["decode_ms"] for r in again["rows"] if r["policy"] == "b" and r["decode_ms"]} == decodes_b

    calls.clear()  # a narrower table (one policy, one delay) runs nothing and loses no row
    monkeypatch.setattr(
        sys, "argv", argv[:3] + ["--episodes", "1", "--max-steps", "8", "--delays", "50"] + ["--out", str(out)]
    )
    module.main()
    kept = json.loads((out / "delay.json").read_text())["rows"]
    assert calls == [] and kept == again["rows"]
    assert "2 policies: b=" in (out / "README.md").read_text()

    # --schemes runs only those asked; the rows of the others stay
    monkeypatch.setattr(
        sys,
        "argv",
        argv[:3]
        + ["--episodes", "1", "--max-steps", "8", "--delays", "50,75"]
        + ["--out", str(out), "--schemes", "ahead"],
    )
    module.main()
    rows = json.loads((out / "delay.json").read_text())["rows"]
    assert calls == [150.0] and [r["scheme"] for r in rows if r["delay_ms_each_way"] == 75.0] == ["ahead"]
    assert len([r for r in rows if r["delay_ms_each_way"] == 50.0]) == 9  # both policies' rows kept
    monkeypatch.setattr(sys, "argv", argv + ["--schemes", "sideways", "--out", str(out)])
    with pytest.raises(SystemExit):
        module.main()


def test_a_study_runs_own_evaluation_is_the_no_delay_row(tiny_dataset_root, tmp_path, monkeypatch):
    """A policy in a study's run folder whose evaluation (``<run>/eval/eval_info.json``) asked the same task, episodes
    and step limit is not evaluated again with no delay: that evaluation is the row; other settings are evaluated."""
    from vla import evaluate as evaluation

    policy = train_micro_policy(tiny_dataset_root, tmp_path / "run" / "train", tokenizer_config("bin", n_bins=64))
    evaluation.evaluate(policy, "metaworld/push-v3", 1, max_steps=8, out_dir=tmp_path / "run" / "eval", progress=False)
    saved = json.loads((tmp_path / "run" / "eval" / "eval_info.json").read_text())
    module = delay_table()
    calls = []
    evaluate = module.evaluate
    monkeypatch.setattr(module, "evaluate", lambda *a, **k: calls.append(k["delay_ms"]) or evaluate(*a, **k))
    out = tmp_path / "delay"
    args = ["--policy", f"s0={policy}", "--episodes", "1", "--max-steps", "8", "--delays", "0", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["delay_table.py", *args])
    module.main()
    rows = json.loads((out / "delay.json").read_text())["rows"]
    assert None not in calls and len(calls) == 5  # the five delayed schemes only
    assert rows[0]["scheme"] == "no delay" and rows[0]["successes"] == saved["successes"]
    calls.clear()
    monkeypatch.setattr(
        sys,
        "argv",
        ["delay_table.py", *args[:4], "--max-steps", "9", "--delays", "0", "--out", str(tmp_path / "other")],
    )
    module.main()  # another step limit: the study's evaluation does not answer it
    assert calls[0] is None
    calls.clear()  # one decode time for every policy, not measured: 25 ms at 80 Hz is 2 steps
    monkeypatch.setattr(
        sys, "argv", ["delay_table.py", *args[:-1], str(tmp_path / "fixed"), "--decode-ms", "25", "--schemes", "ahead"]
    )
    module.main()
    rows = json.loads((tmp_path / "fixed" / "delay.json").read_text())["rows"]
    assert [(r["scheme"], r["decode_ms"], r["delay_steps"]) for r in rows[1:]] == [("ahead", 25.0, 2)]


def test_the_table_lists_each_group_no_delay_first_then_scheme_by_scheme_each_by_delay():
    module = delay_table()

    def row(policy, scheme, delay, rate):
        return dict(
            policy=policy,
            scheme=scheme,
            delay_ms_each_way=delay,
            success_rate=rate,
            delay_steps=None if delay is None else int(delay // 10),
            decode_ms=None if delay is None else 48.0,
            held_steps_mean=0.0,
            switch_jump_mean=0.5,
            step_change_mean=0.1,
        )

    rows = [  # in the order a resumed table would hold them: by run, then delay
        row("fast-s0", "no delay", None, 0.7),
        row("fast-s0", "when empty", 100.0, 0.6),
        row("fast-s0", "every decode + ensemble", 100.0, 0.4),
        row("beast-s0", "no delay", None, 0.8),
        row("fast-s0", "when empty", 50.0, 0.65),
        row("fast-s1", "when empty", 50.0, 0.75),
        row("fast-s0", "every decode + ensemble", 0.0, 0.5),
        row("beast-s0", "when empty", 0.0, 0.82),
    ]
    cells = module.table(rows)
    assert [(c["group"], c["scheme"], c["delay_ms_each_way"]) for c in cells] == [
        ("fast", "no delay", None),
        ("fast", "when empty", 50.0),
        ("fast", "when empty", 100.0),
        ("fast", "every decode + ensemble", 0.0),
        ("fast", "every decode + ensemble", 100.0),
        ("beast", "no delay", None),
        ("beast", "when empty", 0.0),
    ]
    assert cells[1]["mean"] == pytest.approx(0.7) and cells[1]["per_policy"] == {"fast-s0": 0.65, "fast-s1": 0.75}
