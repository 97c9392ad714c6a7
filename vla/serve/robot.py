"""A simulated robot for a policy server: Meta-World in real time at its control rate, driven by ``ChunkExecutor``.

    python -m vla.serve.robot --port 8000 [--host 127.0.0.1] [--task push-v3] [--episodes 5] [--mode overlapped]
        [--k K] [--every K [--connections N] [--temporal-ensemble C]] [--api-key KEY]

The client half of "On a robot" in the README, and what ``scripts/bench_serve.py`` runs: the world steps every
``1 / env.fps`` seconds whatever the network does (``Rate``); the executor supplies an action each tick. It waits
only for an episode's first chunk (the robot at rest before it starts). Prints one line per episode and a summary.
A policy that reads a state history (``n_obs_steps`` > 1 in the server's metadata) is sent the episode's last states
``[n, 39]``, kept by the executor every tick.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from vla.sim import EVAL_SEED_START

from .client import PolicyClient
from .executor import ChunkExecutor, Rate, action_jerk
from .settings import ServeConfig


def run_realtime_episode(env, executor: ChunkExecutor, seed: int, max_steps: int) -> dict[str, Any]:
    """One episode on ``seed`` in real time; the executor's counters for this episode and the action jerk."""
    obs = env.reset(seed)
    executor.reset()
    before = executor.stats.as_dict()
    rate = Rate(env.fps)
    success, steps = False, 0
    for steps in range(1, max_steps + 1):
        action = executor.act({"observation.state": obs["observation.state"], "prompt": obs["task"]})
        if steps == 1:
            rate.reset()  # the world starts once the first chunk is in
        obs, _, done, info = env.step(action)
        success = success or bool(info["success"])
        if done:
            break
        rate.sleep()
    after = executor.stats.as_dict()
    counts = {k: after[k] - before[k] for k in ("held", "stale", "wasted_chunks", "chunks", "errors", "requests")}
    jerk = action_jerk(np.asarray(executor.executed_actions))
    return {"seed": seed, "success": success, "length": steps, "jerk": jerk, "overruns": rate.overruns, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vla.serve.robot", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=ServeConfig.host)
    parser.add_argument("--port", type=int, default=ServeConfig.port)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--task", default="push-v3", help="a Meta-World task the policy was trained on")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--seed-start", type=int, default=EVAL_SEED_START, help="evaluation seeds")
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--mode", choices=("overlapped", "sync"), default="overlapped")
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help="ask for the next chunk with k actions left (default: from the measured round trip)",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=None,
        help="overlapped: ask every K ticks, several requests on their way, each on its own connection",
    )
    parser.add_argument(
        "--connections", type=int, default=4, help="with --every: connections, the most requests on their way"
    )
    parser.add_argument(
        "--temporal-ensemble",
        type=float,
        default=None,
        metavar="COEFF",
        help="with --every: blend each reply with the chunks still running (ACT's temporal ensembling, ACT: 0.01)",
    )
    args = parser.parse_args(argv)
    if args.temporal_ensemble is not None and args.every is None:
        parser.error("--temporal-ensemble blends the replies of requests sent every K ticks: add --every K")

    from vla.sim.metaworld_env import MetaWorldEnv

    client = PolicyClient(args.host, args.port, api_key=args.api_key)
    clients = [client] + [
        PolicyClient(args.host, args.port, api_key=args.api_key)
        for _ in range(args.connections - 1 if args.every else 0)
    ]
    policy = client.metadata.get("policy", {})
    env = MetaWorldEnv(args.task, max_steps=args.max_steps)
    horizon = policy.get("n_action_steps") if args.mode == "sync" else policy.get("time_horizon")
    executor = ChunkExecutor(
        clients,
        control_hz=env.fps,
        k=args.k,
        horizon=horizon,
        mode=args.mode,
        every=args.every,
        ensemble=args.temporal_ensemble,
    )
    results = []
    try:
        for e in range(args.episodes):
            r = run_realtime_episode(env, executor, args.seed_start + e, args.max_steps)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        executor.close()
        for c in clients:
            c.close()
        env.close()
    ticks = sum(r["length"] for r in results)
    print(
        f"{args.task} at {env.fps} Hz, {args.mode}: success {np.mean([r['success'] for r in results]):.0%} over "
        f"{len(results)} episodes, held {sum(r['held'] for r in results) / max(ticks, 1):.0%} of ticks, "
        f"round trip p50 {executor.stats.as_dict()['round_trip_ms_p50']:.0f} ms",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
