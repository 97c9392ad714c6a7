"""Closed-loop evaluation: run a trained policy in the simulator on evaluation seeds and report how it did.

    vla eval --policy outputs/train/debug/policy --env metaworld --task push-v3 --episodes 50 [--gif N]

Evaluation seeds start at ``EVAL_SEED_START``; recordings for training never use them. Reports the success
rate, mean return and episode length, latency per predicted chunk (mean, p95) and the share of chunks whose ids
decoded validly, as JSON (and an optional GIF of the first episodes when the policy uses a camera).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from action_tokenizers.base import atomic_write_text
from vla.policy import VLAPolicy
from vla.sim.metaworld_env import EVAL_SEED_START, MetaWorldEnv
from vla.sim.rollout import run_episode, summarize

ENVS = ("metaworld",)


class ChunkPolicy:
    """A ``VLAPolicy`` as the rollout helper's ``obs -> actions [T, D]`` callable, timing every chunk."""

    def __init__(self, policy: VLAPolicy):
        self.policy = policy.eval()
        self.latencies_ms: list[float] = []
        self.valid: list[bool] = []
        self.tokens: list[int] = []

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        batch = {k: torch.as_tensor(np.asarray(v))[None] for k, v in obs.items() if k.startswith("observation.")}
        batch["task"] = [obs["task"]]
        start = time.perf_counter()
        with torch.inference_mode():
            chunk = self.policy.predict_action_chunk(batch)  # [1, T, D] raw units
        self.latencies_ms.append((time.perf_counter() - start) * 1000)
        info = self.policy.last_decode_info
        self.valid.extend(np.asarray(info["valid"]).tolist())
        self.tokens.extend(np.asarray(info["tokens_per_chunk"]).tolist())
        return chunk[0].float().cpu().numpy()

    def reset(self) -> None:
        self.policy.reset()


def evaluate(
    policy: VLAPolicy | str | Path,
    task: str,
    episodes: int,
    *,
    seed_start: int = EVAL_SEED_START,
    n_action_steps: int | None = None,
    max_steps: int = 500,
    gif_episodes: int = 0,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if not isinstance(policy, VLAPolicy):
        path = Path(policy)
        if not path.is_dir():
            raise ValueError(f"no policy at {path}; pass the folder a training run wrote (e.g. outputs/train/NAME/policy)")
        policy = VLAPolicy.from_pretrained(path)
    config = policy.config
    if seed_start < EVAL_SEED_START:
        raise ValueError(f"evaluation seeds start at {EVAL_SEED_START}; {seed_start} could overlap training seeds")
    image_keys = list(config.image_keys)
    cameras = [k.removeprefix("observation.images.") for k in image_keys]
    if len(cameras) > 1:
        raise ValueError(f"the Meta-World evaluator renders one camera; the policy uses {image_keys}")
    steps = n_action_steps or config.n_action_steps
    runner = ChunkPolicy(policy)
    frames: list[np.ndarray] = []
    record_frames = gif_episodes > 0 and bool(cameras)
    env_kwargs = {"image_size": config.image_size, "camera": cameras[0]} if cameras else {}
    results = []
    seeds = range(seed_start, seed_start + episodes)
    if progress:
        from tqdm.auto import tqdm

        seeds = tqdm(seeds, desc=f"eval {task}", unit="ep")
    with MetaWorldEnv(task, max_steps=max_steps, **env_kwargs) as env:
        for k, seed in enumerate(seeds):
            on_step = None
            if record_frames and k < gif_episodes:
                on_step = lambda obs, action: frames.append(env.last_frame.copy())  # noqa: E731
            results.append(run_episode(env, runner, seed, n_action_steps=steps, on_step=on_step))
    report = summarize(results)
    lat = np.asarray(runner.latencies_ms)
    report.update(
        task=task,
        seed_start=seed_start,
        n_action_steps=steps,
        chunks=len(lat),
        latency_ms_mean=float(lat.mean()),
        latency_ms_p95=float(np.percentile(lat, 95)),
        valid_chunk_rate=float(np.mean(runner.valid)) if runner.valid else 1.0,
        tokens_per_chunk=float(np.mean(runner.tokens)) if runner.tokens else 0.0,
    )
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "eval_info.json", json.dumps(report, indent=2) + "\n")
        if frames:
            import imageio.v2 as imageio

            imageio.mimsave(out_dir / "rollouts.gif", frames[::2], duration=1 / 40)
    return report


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("eval", help="closed-loop evaluation of a trained policy", description=__doc__)
    p.add_argument("--policy", type=Path, required=True, help="a policy folder (outputs/train/NAME/policy)")
    p.add_argument("--env", default="metaworld", choices=ENVS)
    p.add_argument("--task", default="push-v3")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed-start", type=int, default=EVAL_SEED_START)
    p.add_argument("--n-action-steps", type=int, default=None, help="actions run per chunk (default: the policy's)")
    p.add_argument("--gif", type=int, default=0, help="save a GIF of this many episodes (policies with a camera)")
    p.add_argument("--out", type=Path, default=None, help="folder for eval_info.json (default: beside the policy)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = args.out or args.policy.parent / f"eval_{args.task}"
    report = evaluate(
        args.policy, args.task, args.episodes, seed_start=args.seed_start,
        n_action_steps=args.n_action_steps, gif_episodes=args.gif, out_dir=out,
    )  # fmt: skip
    print(
        f"{args.task}: success {report['success_rate']:.1%} over {report['episodes']} episodes, "
        f"return {report['mean_return']:.1f}, latency {report['latency_ms_mean']:.0f} ms/chunk "
        f"(p95 {report['latency_ms_p95']:.0f}), valid chunks {report['valid_chunk_rate']:.1%}; wrote {out}"
    )
    return 0
