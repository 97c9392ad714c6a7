"""Closed-loop rollouts: run a chunk policy in a simulator on fixed seeds and report how it did.

A policy is any callable ``policy_fn(obs) -> actions [T, D]`` (numpy or torch; a single action [D] is
read as T = 1), optionally with a ``reset()`` called before each episode. The helper executes the first
``n_action_steps`` actions of each chunk (all of them when None), then asks again. An episode ends on
success or at ``max_steps``; recording (``vla.sim.record``) uses the same loop, so the expert scores the
same here as it did there on the same seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla.sim.metaworld_env import (
    ACTION_DIM,
    DEFAULT_CAMERA,
    DEFAULT_MAX_STEPS,
    EVAL_SEED_START,
    MetaWorldEnv,
)

Policy = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    success: bool
    ret: float  # sum of rewards
    length: int  # actions executed


def _as_chunk(actions: Any, action_dim: int) -> np.ndarray:
    """Policy output -> float64 [T, D]; a clear error for anything else."""
    if hasattr(actions, "detach"):  # a torch tensor
        actions = actions.detach().cpu().numpy()
    chunk = np.asarray(actions, dtype=np.float64)
    if chunk.ndim == 1:
        chunk = chunk[None]
    if chunk.ndim != 2 or chunk.shape[0] == 0 or chunk.shape[1] != action_dim:
        raise ValueError(
            f"the policy must return actions [T, {action_dim}] (or one action [{action_dim}]), "
            f"got shape {chunk.shape}"
        )
    return chunk


def run_episode(
    env: MetaWorldEnv,
    policy_fn: Policy,
    seed: int,
    *,
    n_action_steps: int | None = None,
    on_step: Callable[[dict[str, Any], np.ndarray], None] | None = None,
) -> EpisodeResult:
    """One closed-loop episode on ``seed``. ``on_step(obs, action)`` sees each action before it runs."""
    if n_action_steps is not None and n_action_steps < 1:
        raise ValueError(f"n_action_steps must be at least 1 (or None for whole chunks), got {n_action_steps}")
    if hasattr(policy_fn, "reset"):
        policy_fn.reset()
    obs = env.reset(seed)
    ret, length, success, done = 0.0, 0, False, False
    while not done:
        chunk = _as_chunk(policy_fn(obs), ACTION_DIM)  # [T, 4]
        for action in chunk[: n_action_steps or len(chunk)]:
            if on_step is not None:
                on_step(obs, action)
            obs, reward, done, info = env.step(action)
            ret += reward
            length += 1
            success = info["success"]
            if done:
                break
    return EpisodeResult(seed=int(seed), success=bool(success), ret=float(ret), length=length)


def rollout(
    policy_fn: Policy,
    task: str,
    *,
    episodes: int,
    seed_start: int = EVAL_SEED_START,
    n_action_steps: int | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    image_size: int | None = None,
    camera: str = DEFAULT_CAMERA,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``policy_fn`` for ``episodes`` episodes on seeds ``seed_start, seed_start + 1, ...``.

    Returns ``success_rate``, ``mean_return``, ``mean_length`` and per-episode lists ``successes``,
    ``returns``, ``lengths``, ``seeds``. Evaluation seeds by default (``EVAL_SEED_START``), which no
    training recording uses.

    >>> rollout(ExpertPolicy("push-v3"), "push-v3", episodes=10)["success_rate"]  # doctest: +SKIP
    1.0
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    results: list[EpisodeResult] = []
    with MetaWorldEnv(task, image_size=image_size, camera=camera, max_steps=max_steps) as env:
        seeds = range(seed_start, seed_start + episodes)
        if progress:
            from tqdm import tqdm

            seeds = tqdm(seeds, desc=f"rollout {task}", unit="ep")
        for seed in seeds:
            results.append(run_episode(env, policy_fn, seed, n_action_steps=n_action_steps))
    return summarize(results)


def summarize(results: list[EpisodeResult]) -> dict[str, Any]:
    """Aggregate episode results into the rollout report."""
    successes = [r.success for r in results]
    returns = [r.ret for r in results]
    lengths = [r.length for r in results]
    return {
        "episodes": len(results),
        "success_rate": float(np.mean(successes)) if results else 0.0,
        "mean_return": float(np.mean(returns)) if results else 0.0,
        "mean_length": float(np.mean(lengths)) if results else 0.0,
        "successes": successes,
        "returns": returns,
        "lengths": lengths,
        "seeds": [r.seed for r in results],
    }


__all__ = ["EpisodeResult", "rollout", "run_episode", "summarize"]
