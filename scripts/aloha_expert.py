"""Measure the scripted ALOHA expert (vla.sim.aloha_expert): success on training seeds, and seconds per episode.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/aloha_expert.py      # writes results/aloha/expert.json

Per task: the expert is planned on seeds 0..49 (end-effector model) and replayed in the joint-space env through
vla.sim.rollout.run_episodes, the loop recording and evaluation use; an episode succeeds when the reward reaches 4.
Timings: seconds per episode (planning + replay) with no camera on all 50 seeds, and with the top camera at the
default 128 px on the first 10.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from vla.sim import make_env, make_expert
from vla.sim.rollout import run_episodes, summarize

SEEDS = range(50)
CAMERA_SEEDS = range(10)
OUT = Path(__file__).resolve().parent.parent / "results" / "aloha" / "expert.json"


def run(name: str, seeds: range, image_keys: list[str]) -> tuple[dict, float, list[bool]]:
    env, expert = make_env(name, image_keys=image_keys), make_expert(name)
    planned: list[bool] = []

    def policy(observations):
        return [expert(observations[0])]

    results = []
    start = time.perf_counter()
    with env:
        for seed in seeds:  # one env, one episode at a time: the expert plans per seed
            expert.reset(seed)
            planned.append(bool(expert.planned_success))
            results += run_episodes([env], policy, [seed])
    return summarize(results), (time.perf_counter() - start) / len(seeds), planned


def main() -> None:
    report = {"seeds": f"{SEEDS.start}..{SEEDS.stop - 1}", "tasks": {}}
    for task in ("transfer-cube", "insertion"):
        name = f"aloha/{task}"
        summary, seconds, planned = run(name, SEEDS, [])
        _, seconds_cam, _ = run(name, CAMERA_SEEDS, ["observation.images.top"])
        report["tasks"][task] = {
            "success_rate": summary["success_rate"],
            "failed_seeds": [s for s, ok in zip(summary["seeds"], summary["successes"]) if not ok],
            "mean_length": summary["mean_length"],
            "lengths": summary["lengths"],
            "planned_success_rate": float(np.mean(planned)),  # the plan in the end-effector model, before replay
            "seconds_per_episode_no_camera": round(seconds, 3),
            "seconds_per_episode_top_128px": round(seconds_cam, 3),
        }
        print(task, {k: v for k, v in report["tasks"][task].items() if k != "lengths"})
    report["versions"] = {p: version(p) for p in ("mujoco", "gym-aloha")}
    load = os.getloadavg()[0]  # the timings are wall clock: a busy machine slows them down
    report["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, 1 thread used, load average {load:.1f} at the end"
    )
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
