#!/usr/bin/env python
"""Why cross-entropy: on demonstrations with two right answers, a tokenized policy sampled with temperature keeps both,
a regression policy trained with MSE averages them into a wrong one.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/multimodal.py --out results/multimodal [--steps 2000] [--work DIR]

End to end, on the ``toy/obstacle`` task (``vla.sim.toy_env``: a point robot goes around a disc to a goal; the expert
goes LEFT or RIGHT, 50/50 per episode, from the same start):

1. record ``--episodes`` expert demonstrations (``vla.sim.record``, training seeds from 0);
2. train the tokenized policy with ``vla train`` (``configs/fast.yaml``: the tiny preset, FAST, T=10 with 5 actions
   run per chunk; ``--steps`` steps, the cosine decay over as many);
3. train the regression baseline (``vla.regression``): an MLP from the state to the normalised chunk, trained with MSE
   on the same chunks, same normalisation, optimiser, schedule, batch and steps, its width chosen so that its
   parameter count matches the tokenized policy's (the parameters that run on a state-only task: the Gemma decoder,
   its embeddings and the state encoder; the vision tower, never run without a camera, is left out of the count);
4. roll out ``--eval-episodes`` episodes each on the evaluation seeds: the tokenized policy sampled at temperature 1.0
   and 0.7 and decoded greedily (temperature 0), and the regression policy;
5. write ``multimodal.json``, ``multimodal.md`` (the table) and ``trajectories.png`` into ``--out``.

An episode's outcome is a success, a collision (the episode ends) or a stall (``max_steps`` reached); its mode is the
side on which it passed the disc (``toy_env.side_of``: the sign of x where it first reaches the disc's height), "none"
when it never got there. ``--tokenized-policy`` reuses a policy ``vla train`` already wrote with these settings
(skips step 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lerobot.utils.constants import OBS_STATE  # noqa: E402

from vla.data import columns, reader  # noqa: E402
from vla.io import atomic_write_text, save_figure, write_json  # noqa: E402
from vla.regression import RegressionConfig, RegressionPolicy, hidden_for, train_regression  # noqa: E402
from vla.sim import (  # noqa: E402
    EVAL_SEED_START,
    make_env,
    toy_env,  # noqa: E402
)
from vla.sim.rollout import run_episodes  # noqa: E402

ENV = "toy/obstacle"
CONFIG = "configs/fast.yaml"
TEMPERATURES = (1.0, 0.7, 0.0)
NUM_ENVS = 10
PLOTTED = 50  # trajectories drawn per panel
COLORS = {"left": "tab:blue", "right": "tab:orange", "none": "tab:red"}


class TrackedEnv:
    """An env that keeps each episode's positions and outcome, by seed (``run_episodes`` restarts envs itself)."""

    def __init__(self, env: toy_env.ToyObstacleEnv, log: dict[int, dict[str, Any]]):
        self.env, self.log, self.seed = env, log, None
        for name in ("name", "task_text", "fps", "action_dim", "max_steps", "robot_type", "features", "last_frames"):
            setattr(self, name, getattr(env, name))

    def reset(self, seed: int) -> dict[str, Any]:
        obs = self.env.reset(seed)
        self.seed = int(seed)
        self.log[self.seed] = {"positions": [self.env.position.copy()], "outcome": None}
        return obs

    def step(self, action, render=True):
        obs, reward, done, info = self.env.step(action, render)
        episode = self.log[self.seed]
        episode["positions"].append(self.env.position.copy())
        if done:
            episode["outcome"] = "success" if info["success"] else "collision" if info["collision"] else "stall"
        return obs, reward, done, info

    def close(self) -> None:
        self.env.close()


def rollouts(batch_policy, episodes: int, n_action_steps: int) -> list[dict[str, Any]]:
    """``episodes`` episodes on the evaluation seeds: per episode its seed, outcome, side, length and positions."""
    log: dict[int, dict[str, Any]] = {}
    envs = [TrackedEnv(make_env(ENV), log) for _ in range(NUM_ENVS)]
    seeds = list(range(EVAL_SEED_START, EVAL_SEED_START + episodes))
    run_episodes(envs, batch_policy, seeds, n_action_steps=n_action_steps)
    out = []
    for seed in seeds:
        positions = np.asarray(log[seed]["positions"])
        out.append(
            {
                "seed": seed,
                "outcome": log[seed]["outcome"],
                "side": toy_env.side_of(positions),
                "length": len(positions) - 1,
                "positions": positions,
            }
        )
    return out


def demonstrations(root: Path) -> list[dict[str, Any]]:
    """The recorded episodes: positions and side, read back from the dataset's states."""
    info = reader.dataset_info(root)
    states = columns.chunk_states(info)  # [N, S], every frame in dataset order
    bounds = np.cumsum([0, *info.episode_lengths.tolist()])
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        positions = states[start:end, :2]
        out.append(
            {
                "outcome": "success",
                "side": toy_env.side_of(positions),
                "length": int(end - start),
                "positions": positions,
            }
        )
    return out


def summary(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(episodes)
    sides = {s: sum(e["side"] == s for e in episodes) for s in ("left", "right", "none")}
    outcomes = {o: sum(e["outcome"] == o for e in episodes) for o in ("success", "collision", "stall")}
    around = sides["left"] + sides["right"]
    return {
        "episodes": n,
        "success_rate": outcomes["success"] / n,
        "collision_rate": outcomes["collision"] / n,
        "stall_rate": outcomes["stall"] / n,
        "sides": sides,
        "left_share": sides["left"] / around if around else None,  # of the episodes that went around
        "mean_length": float(np.mean([e["length"] for e in episodes])),
        "successes_by_side": {s: sum(e["side"] == s and e["outcome"] == "success" for e in episodes) for s in sides},
    }


def used_parameters(policy) -> int:
    """Parameters that run on a state-only task: everything but the vision tower and its projector."""
    return sum(
        p.numel()
        for name, p in policy.named_parameters()
        if "vision" not in name and "multi_modal_projector" not in name
    )


def train_tokenized(dataset: Path, run: Path, steps: int) -> tuple[Path, float]:
    from vla.config import load_config
    from vla.train import main

    cfg = load_config(
        CONFIG,
        [
            f"--dataset_root={dataset}",
            f"--output_dir={run}",
            f"--steps={steps}",
            f"--policy.scheduler_decay_steps={steps}",
            f"--save_every={steps}",
            "--overwrite=true",
        ],
    )
    result = main(cfg)
    return Path(result["policy_path"]), float(result["train_seconds"])


def plot(panels: list[tuple[str, list[dict[str, Any]]]], out: Path) -> None:
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.6), sharex=True, sharey=True)
    for ax, (title, episodes) in zip(axes, panels):
        ax.add_patch(plt.Circle(toy_env.OBSTACLE_CENTER, toy_env.OBSTACLE_RADIUS, color="0.6", zorder=0))
        ax.add_patch(plt.Circle(toy_env.GOAL, toy_env.GOAL_RADIUS, color="tab:green", alpha=0.3))
        for e in episodes[:PLOTTED]:
            p = e["positions"]
            ax.plot(p[:, 0], p[:, 1], color=COLORS[e["side"]], lw=0.8, alpha=0.6)
            if e["outcome"] != "success":
                ax.plot(p[-1, 0], p[-1, 1], "x", color="k" if e["outcome"] == "collision" else "tab:purple", ms=5)
        s = summary(episodes)
        ax.set_title(
            f"{title}\nL {s['sides']['left']} / R {s['sides']['right']} / none {s['sides']['none']}, "
            f"success {s['success_rate']:.0%}",
            fontsize=9,
        )
        ax.set_xlim(-1, 1)
        ax.set_ylim(-1, 1)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
    fig.suptitle(
        f"toy/obstacle: first {PLOTTED} episodes per panel (blue left, orange right, red neither; x = collision)",
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, out)


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| policy | success | collision | stall | left / right / none | left share (went around) | mean length |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in rows.items():
        share = "n/a" if s["left_share"] is None else f"{s['left_share']:.0%}"
        lines.append(
            f"| {name} | {s['success_rate']:.0%} | {s['collision_rate']:.0%} | {s['stall_rate']:.0%} | "
            f"{s['sides']['left']} / {s['sides']['right']} / {s['sides']['none']} | {share} | "
            f"{s['mean_length']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/multimodal", help="where the JSON, table and plot go")
    parser.add_argument("--work", default="outputs/multimodal", help="dataset and runs (default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=100, help="demonstrations to record")
    parser.add_argument("--eval-episodes", type=int, default=100, help="rollouts per policy")
    parser.add_argument("--steps", type=int, default=2000, help="optimiser steps for each policy")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the rollouts")
    parser.add_argument("--tokenized-policy", default=None, help="a policy folder vla train wrote; skips training it")
    args = parser.parse_args()
    from vla.evaluate import ChunkPolicy
    from vla.policy import VLAPolicy
    from vla.sim.record import record

    started = time.perf_counter()
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    t = time.perf_counter()
    dataset = work / "dataset"
    rec = record(ENV, args.episodes, dataset, overwrite=True)
    times["record_s"] = time.perf_counter() - t

    if args.tokenized_policy:
        policy_path, times["train_tokenized_s"] = Path(args.tokenized_policy), None
    else:
        policy_path, times["train_tokenized_s"] = train_tokenized(dataset, work / "tokenized", args.steps)
    policy = VLAPolicy.from_pretrained(policy_path).eval()
    tokenized_params = used_parameters(policy)
    c = policy.config

    t = time.perf_counter()
    info = reader.dataset_info(dataset)
    shape = dict(state_dim=info.state_dim, action_dim=info.action_dim, time_horizon=c.time_horizon)
    reg_config = RegressionConfig(
        **shape, n_action_steps=c.n_action_steps, hidden=hidden_for(tokenized_params, **shape)
    )
    regression, reg_losses = train_regression(dataset, reg_config, steps=args.steps, batch_size=32, seed=0)
    regression.save_pretrained(work / "regression")
    regression = RegressionPolicy.from_pretrained(work / "regression")  # what was saved is what runs
    times["train_regression_s"] = time.perf_counter() - t

    t = time.perf_counter()
    panels: list[tuple[str, list[dict[str, Any]]]] = [("demonstrations", demonstrations(dataset))]
    for temperature in TEMPERATURES:
        policy.config = dataclasses.replace(c, temperature=temperature)
        torch.manual_seed(args.seed)
        name = "tokenized, greedy (T=0)" if temperature == 0 else f"tokenized, T={temperature}"
        panels.append((name, rollouts(ChunkPolicy(policy), args.eval_episodes, c.n_action_steps)))

    def regress(observations):
        return regression.predict_action_chunk({OBS_STATE: np.stack([o[OBS_STATE] for o in observations])})

    panels.append(("regression (MSE)", rollouts(regress, args.eval_episodes, reg_config.n_action_steps)))
    times["rollouts_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - started

    rows = {name: summary(episodes) for name, episodes in panels}
    report = {
        "env": ENV,
        "demonstrations": {"episodes": rec["episodes"], "frames": rec["frames"], "seed_start": rec["seed_start"]},
        "eval_seed_start": EVAL_SEED_START,
        "eval_episodes": args.eval_episodes,
        "steps": args.steps,
        "tokenized": {
            "config": CONFIG,
            "policy": str(policy_path),
            "tokenizer": policy.action_tokenizer.name,
            "preset": c.preset,
            "parameters_used": tokenized_params,
            "parameters_all": sum(p.numel() for p in policy.parameters()),
            "time_horizon": c.time_horizon,
            "n_action_steps": c.n_action_steps,
            "top_p": c.top_p,
        },
        "regression": {
            **dataclasses.asdict(reg_config),
            "parameters": reg_config.parameters(),
            "final_loss": float(np.mean(reg_losses[-50:])),
        },
        "results": rows,
        "seconds": {k: None if v is None else round(v, 1) for k, v in times.items()},
        "threads": torch.get_num_threads(),
    }
    write_json(out / "multimodal.json", report)
    header = (
        f"{ENV}: {rec['episodes']} demonstrations (expert LEFT or RIGHT 50/50), {args.eval_episodes} evaluation "
        f"episodes per policy; tokenized = {CONFIG} ({c.preset}, {policy.action_tokenizer.name}, "
        f"{tokenized_params:,} parameters used), regression = MLP {reg_config.layers} x {reg_config.hidden} "
        f"({reg_config.parameters():,} parameters), MSE; {args.steps} steps x 32 each\n\n"
    )
    atomic_write_text(out / "multimodal.md", header + table(rows))
    plot(panels, out / "trajectories.png")
    print(header + table(rows))
    print(
        f"wrote {out / 'multimodal.json'}, {out / 'multimodal.md'}, {out / 'trajectories.png'} "
        f"in {times['total_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
