"""scripts/bench_train.py's table: old against new code per thread count, and two processes side by side against one
alone."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def _row(recipe, threads, code, rate, processes=1):
    return {
        "recipe": recipe,
        "threads": threads,
        "processes": processes,
        "code": code,
        "samples_per_s": rate,
        "steady_samples_per_s": rate * 1.1,
        "final_loss": 3.5,
        "runs": [{}] * processes,
    }


def test_the_table_sets_each_code_beside_the_old_one_and_two_processes_beside_one_alone():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_train

    meta = {"steps": 60, "repeats": 1, "cpus": 2, "load_average_min": 1.0, "load_average_max": 2.1}
    meta["codes"] = {"before": "aaa", "after": "bbb"}
    rows = [
        _row("fast", 1, "before", 300.0),
        _row("fast", 1, "after", 400.0),
        _row("fast", 1, "before", 270.0, processes=2),
        _row("fast", 1, "after", 380.0, processes=2),
        _row("fast", 2, "after", 500.0),  # no old row at 2 threads: no speed-up to give
    ]
    table = bench_train.markdown({"meta": meta, "rows": rows})
    lines = {line.split(" | ")[1] + "/" + line.split(" | ")[2]: line for line in table.splitlines()[4:]}
    assert "| 1.33x | 1.33x |" in lines["1/after"]
    assert lines["1, 2 processes at once/after"].endswith("| 1.41x | 1.41x | 3.5000 | 0.95 |")  # 380 / 400 alone
    assert lines["1, 2 processes at once/before"].endswith("| 0.90 |")  # 270 / 300 alone
    assert lines["2/after"].endswith("|  |  | 3.5000 |  |")
