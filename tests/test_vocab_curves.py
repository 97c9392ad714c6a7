"""scripts/vocab_curves.py: FAST's cells gathered from the studies' runs.json into curves of success against the
vocabulary, the ids per chunk and the demonstrations."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_plot

REPO = Path(__file__).parents[1]


def vocab_curves():
    spec = importlib.util.spec_from_file_location("vocab_curves", REPO / "scripts" / "vocab_curves.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(module)
    return module


def _study(results: Path, name: str, runs: list[tuple[str, str, int, float, float]]) -> None:
    """A study's runs.json holding ``(setting, tokenizer, seed, success, ids per chunk)`` runs."""
    rows = [
        {
            "setting": s,
            "tokenizer": t,
            "seed": seed,
            "success_rate": ok,
            "tokens_per_chunk": ids,
            "provenance": {"commit": "0123456789abcdef"},
        }
        for s, t, seed, ok, ids in runs
    ]
    (results / name).mkdir(parents=True)
    (results / name / "runs.json").write_text(json.dumps({"runs": rows}))


def test_cells_take_their_own_runs_and_missing_studies_are_named(tmp_path, monkeypatch):
    module = vocab_curves()
    results = tmp_path / "results"
    _study(results, "push_pixels", [("steps4k", "fast", 0, 0.4, 2.8), ("steps4k", "beast", 0, 0.9, 24.0)])
    _study(
        results, "push_pixels_fast_steps", [("steps4k", "fast_vocab128", s, v, 10.0) for s, v in enumerate([0.6, 0.8])]
    )
    _study(results, "push_pixels_vocab50", [("steps4k", "v128", 0, 0.5, 10.0), ("steps4k", "fast", 0, 0.1, 3.5)])
    rows, missing = module.gather(results)

    cells = {(r["study"], r["vocab"], r["demos"]): r for r in rows}
    assert set(cells) == {
        ("push_pixels", 1024, 200),
        ("push_pixels_fast_steps", 128, 200),
        ("push_pixels_vocab50", 128, 50),
        ("push_pixels_vocab50", 1024, 50),
    }
    assert cells["push_pixels", 1024, 200]["success"] == [0.4]  # BEAST's run is not FAST's cell
    two = cells["push_pixels_fast_steps", 128, 200]
    assert two["mean"] == pytest.approx(0.7) and two["std"] == pytest.approx(0.1414, abs=1e-3)
    assert cells["push_pixels", 1024, 200]["std"] is None
    assert "push_pixels_vocab50: steps4k-v256" in missing and "demo_vocab: steps3k-v128" in missing

    out = tmp_path / "curves"
    monkeypatch.setattr(sys, "argv", ["vocab_curves.py", "--results", str(results), "--out", str(out)])
    assert module.main() == 0
    page = (out / "README.md").read_text()
    assert "| push-v3, 64 px camera, 4,000 steps | 200 | 128 (auto) | 10.0 | 2 | **70.0%** | 14.1 pts |" in page
    assert "1,024*" in page and "Not run yet:" in page and "| 128 (auto) |" in page
    record = json.loads((out / "vocab_curves.json").read_text())
    assert len(record["cells"]) == 4 and record["provenance"]["commit"]
    assert_plot(out / "vocab_curves.png")


def test_no_study_at_all_is_refused_with_what_to_do(tmp_path, monkeypatch):
    module = vocab_curves()
    monkeypatch.setattr(sys, "argv", ["vocab_curves.py", "--results", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="run the studies first"):
        module.main()
