"""Closed-loop rollouts: run a chunk policy in any ``vla.sim.Env`` on fixed seeds and report how it did.

A policy is any callable ``policy_fn(obs) -> actions [T, D]`` (numpy or torch; a single action [D] is
read as T = 1). The loop executes the first ``n_action_steps`` actions of each chunk (all of them when None),
then asks again, or with ``ensemble`` asks every ``n_action_steps`` (default 1) and runs ACT's temporal ensemble of
the overlapping chunks (``vla.execution``). With ``delay_steps`` a chunk arrives that many steps after it was asked
for, the simulator stepping meanwhile (``vla.execution.DelayedQueue``), as behind a network and a slow decode.
The cameras are drawn only for the observations a policy is shown (``Env.step(render=...)``): the first of each
chunk, one step in ``n_action_steps``. An episode ends on success or at the env's ``max_steps``; recording (``vla.sim.record``) and
evaluation (``vla.evaluate``) use the same loop, so the expert scores the same here as it did there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from lerobot.utils.constants import OBS_STATE

from vla.execution import COMMITTED, ChunkQueue, DelayedQueue, StateHistory, TemporalEnsemble, executor
from vla.sim import Env

Policy = Callable[[dict[str, Any]], Any]
# A batch policy: a list of observations -> actions [B, T, D] (numpy or torch), one chunk per observation.
BatchPolicy = Callable[[list[dict[str, Any]]], Any]


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    success: bool
    ret: float  # sum of rewards
    length: int  # actions executed
    env: str = ""  # the env's name ("metaworld/push-v3")
    held: int = 0  # steps the robot held still waiting for a late chunk (delay_steps > 0)
    switch_jump: float = 0.0  # mean |a_t - a_(t-1)| (2-norm) where a new chunk took over: the jerk at the hand-over
    step_change: float = 0.0  # the same within chunks, for scale


@dataclass
class _Running:
    """One env's episode in ``run_episodes``: which seed it runs, where it is, what runs its chunks."""

    index: int  # position in ``seeds``
    obs: dict[str, Any]
    actions: ChunkQueue | TemporalEnsemble | DelayedQueue
    history: StateHistory | None = None  # obs_steps > 1
    seen: dict[str, Any] | None = None  # what the policy is shown: obs, its state as the history [n, S] when kept
    ret: float = 0.0
    length: int = 0
    last: np.ndarray | None = None  # the last action run
    held: int = 0
    switch_changes: list[float] = field(default_factory=list)  # |a_t - a_(t-1)| where a new chunk took over
    step_changes: list[float] = field(default_factory=list)  # ... and within a chunk

    def act(self, env: Env) -> np.ndarray:
        """This step's action from the executor (the simulator's hold when a late chunk leaves none), its change
        from the last one counted as a hand-over's or a within-chunk one."""
        action = self.actions.pop()
        if action is None:
            self.held += 1
            hold = getattr(env, "hold_action", None)
            self.last = np.asarray(hold(self.last) if hold is not None else self.last, dtype=np.float64)
            return self.last  # the next chunk's first action is measured against what the robot held
        if self.last is not None:
            change = float(np.linalg.norm(np.asarray(action) - self.last))
            (self.switch_changes if getattr(self.actions, "switched", False) else self.step_changes).append(change)
        self.last = np.asarray(action, dtype=np.float64)
        return action

    def step(self, env: Env, on_step: Callable[[int, dict[str, Any], np.ndarray], None] | None) -> tuple[bool, dict]:
        """One action of the episode on ``env``: ``(done, info)``."""
        action = self.act(env)
        if on_step is not None:
            on_step(self.index, self.obs, action)
        # The next observation is shown to the policy only when the executor wants a chunk at the next tick (nothing
        # else changes it before then), so only then are its cameras drawn (every time for ``on_step``).
        shown = on_step is not None or self.actions.needs_chunk()
        obs, reward, done, info = env.step(action, render=shown)
        self.observe(obs)
        self.ret += reward
        self.length += 1
        return done, info

    def result(self, seed: int, success: bool, env: str) -> EpisodeResult:
        """How the episode on ``seed`` went, now that it ended."""
        return EpisodeResult(
            seed,
            success,
            float(self.ret),
            self.length,
            env,
            self.held,
            _mean(self.switch_changes),
            _mean(self.step_changes),
        )

    def observe(self, obs: dict[str, Any]) -> None:
        self.obs = self.seen = obs
        if self.history is not None and OBS_STATE in obs:
            self.seen = {**obs, OBS_STATE: np.stack(self.history.push(np.asarray(obs[OBS_STATE])))}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _as_chunk(actions: Any, action_dim: int) -> np.ndarray:
    """Policy output -> float64 [T, D]; a clear error for anything else."""
    if hasattr(actions, "detach"):  # a torch tensor
        actions = actions.detach().cpu().numpy()
    chunk = np.asarray(actions, dtype=np.float64)
    if chunk.ndim == 1:
        chunk = chunk[None]
    if chunk.ndim != 2 or chunk.shape[0] == 0 or chunk.shape[1] != action_dim:
        raise ValueError(
            f"the policy must return actions [T, {action_dim}] (or one action [{action_dim}]), got shape {chunk.shape}"
        )
    return chunk


def run_episode(
    env: Env,
    policy_fn: Policy,
    seed: int,
    *,
    n_action_steps: int | None = None,
    ensemble: float | None = None,
    on_step: Callable[[dict[str, Any], np.ndarray], None] | None = None,
) -> EpisodeResult:
    """One closed-loop episode on ``seed``. ``on_step(obs, action)`` sees each action before it runs."""
    step_hook = None if on_step is None else (lambda k, obs, action: on_step(obs, action))
    return run_episodes(
        [env],
        lambda observations: [policy_fn(observations[0])],
        [seed],
        n_action_steps=n_action_steps,
        ensemble=ensemble,
        on_step=step_hook,
    )[0]


def run_episodes(
    envs: list[Env],
    policy_fn: BatchPolicy,
    seeds: list[int] | range | list[tuple[str, int]],
    *,
    n_action_steps: int | None = None,
    ensemble: float | None = None,
    obs_steps: int = 1,
    delay_steps: int = 0,
    ahead: bool = False,
    every: int | None = None,
    commit: bool = False,
    on_step: Callable[[int, dict[str, Any], np.ndarray], None] | None = None,
    on_episode: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Episodes on ``seeds``, run in lockstep on ``envs`` (one episode per env at a time): the same episodes as
    ``run_episode`` seed by seed, but the policy sees the observations of every env that needs a new chunk as one
    batch, so a batched policy (a network on a GPU or a vectorised CPU forward) costs one call per tick, not one
    per env. An env that finishes starts the next episode at once. Results come back in the order of ``seeds``.

    Several tasks run together when ``envs`` hold several (say one or more per Meta-World task) and ``seeds`` are
    ``(env name, seed)`` pairs: each episode runs on an env of that name, and the policy's batches mix the tasks.

    ``ensemble`` (a coefficient, ACT's 0.01) replaces the chunk queue by a temporal ensemble that asks for a chunk
    every ``n_action_steps`` steps (default 1). ``obs_steps = n`` > 1 shows the policy the last n states [n, S]
    of the episode (oldest first; its first repeated until there are n), for policies trained with ``n_obs_steps``.

    ``delay_steps = d`` delivers each chunk d steps after the observation it was predicted from (the episode's first
    at once), the envs stepping meanwhile: synchronous (the robot holds until the reply) or, with ``ahead``, asked d
    actions early with the reply's first d actions skipped (``vla.execution.DelayedQueue``), and with ``every = k``
    asked every k steps with several replies on their way. d = 0 (and not ``ahead``) is exactly the loop without a
    delay. With ``commit`` (and ``ahead``) each request carries the actions
    that will run while it is on its way (``COMMITTED``, raw ``[d, D]``), for committed-prefix decoding.

    ``on_step(k, obs, action)`` sees each action before it runs on the episode of ``seeds[k]`` (every observation
    then has its cameras; without it only those the policy is shown are drawn); ``on_episode``
    sees each result as it ends (for a progress bar). A batch policy must keep no per-episode state: chunks are
    executed by this loop, not queued in the policy.
    """
    if not envs:
        raise ValueError("run_episodes needs at least one env")
    executor(n_action_steps, ensemble, delay_steps, ahead, every)  # bad settings fail here, before any env resets
    if commit and not ahead:
        raise ValueError("committed actions exist only when the next chunk is asked for ahead: pass ahead=True")
    episodes = [(s[0], int(s[1])) if isinstance(s, tuple) else (None, int(s)) for s in seeds]
    missing = {name for name, _ in episodes if name is not None} - {env.name for env in envs}
    if missing:
        raise ValueError(f"no env runs {sorted(missing)}; pass at least one env per task named in seeds")
    results: list[EpisodeResult | None] = [None] * len(episodes)
    pending = list(range(len(episodes)))  # episodes not started yet, in order
    running: list[_Running | None] = [None] * len(envs)  # per env: its episode, or None once none is left for it

    def start(e: int) -> None:
        k = next((k for k in pending if episodes[k][0] in (None, envs[e].name)), None)
        if k is None:
            running[e] = None
            return
        pending.remove(k)
        history = StateHistory(obs_steps) if obs_steps > 1 else None
        queue = executor(n_action_steps, ensemble, delay_steps, ahead, every)
        running[e] = _Running(k, {}, queue, history)
        running[e].observe(envs[e].reset(episodes[k][1]))

    for e in range(len(envs)):
        start(e)
    while any(run is not None for run in running):
        _feed(running, envs, policy_fn, commit)
        for e, run in enumerate(running):
            if run is None:
                continue
            done, info = run.step(envs[e], on_step)
            if done:
                result = results[run.index] = run.result(episodes[run.index][1], bool(info["success"]), envs[e].name)
                if on_episode is not None:
                    on_episode(result)
                start(e)
    return results  # type: ignore[return-value]


def _feed(running: list[_Running | None], envs: list[Env], policy_fn: BatchPolicy, commit: bool = False) -> None:
    """One call of the batch policy on the observations of every episode whose executor wants a chunk (with
    ``commit``, each with the actions that will run while its chunk is on its way), each chunk handed to its
    episode."""
    hungry = [e for e, run in enumerate(running) if run is not None and run.actions.needs_chunk()]
    if not hungry:
        return
    observations = [running[e].seen for e in hungry]
    if commit:
        none = np.zeros((0, envs[0].action_dim))
        committed = [running[e].actions.committed() for e in hungry]
        observations = [{**o, COMMITTED: none if c is None else c} for o, c in zip(observations, committed)]
    chunks = policy_fn(observations)
    if hasattr(chunks, "detach"):
        chunks = chunks.detach().cpu().numpy()
    if len(chunks) != len(hungry):
        raise ValueError(f"the batch policy returned {len(chunks)} chunks for {len(hungry)} observations")
    for e, chunk in zip(hungry, chunks):
        running[e].actions.add(_as_chunk(chunk, envs[e].action_dim))


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
        "held_steps_mean": float(np.mean([r.held for r in results])) if results else 0.0,
        "switch_jump_mean": float(np.mean([r.switch_jump for r in results])) if results else 0.0,
        "step_change_mean": float(np.mean([r.step_change for r in results])) if results else 0.0,
    }


__all__ = ["EpisodeResult", "run_episode", "run_episodes", "summarize"]
