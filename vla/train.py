"""The training loop, read top to bottom: batch -> loss -> step -> log -> checkpoint.

    vla train --config_path configs/debug.yaml [--steps=200 ...]
    accelerate launch -m vla.cli train --config_path configs/paligemma-3b.yaml   # many GPUs / nodes

The action tokenizer is fitted on the training episodes (or loaded) before the first step and saved with every
checkpoint. Checkpoints are JSON + safetensors, written to a temporary folder and renamed, so a crash never
leaves a half-written one; ``--resume=true`` continues from the last one exactly (same batches, same optimiser
and EMA state, same random state), which a test checks against an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm

import action_tokenizers as at
from action_tokenizers.base import atomic_directory, atomic_write_text, read_json
from vla import data
from vla.config import TrainConfig
from vla.policy import VLAConfig, VLAPolicy
from vla.sequence import prompt_words

CHECKPOINTS = "checkpoints"
LAST = "last.json"


class StepBatchSampler(Sampler[list[int]]):
    """Batches as a pure function of (seed, step): epoch e is a permutation seeded by (seed, e).

    Resuming at step k yields exactly the batches an uninterrupted run would have seen from step k on. With
    several processes each takes its slice ``batch[rank::world]`` of the global batch.
    """

    def __init__(self, n: int, batch_size: int, seed: int, start_step: int, steps: int, rank: int = 0, world: int = 1):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.start_step, self.steps, self.rank, self.world = start_step, steps, rank, world

    def batch(self, step: int) -> list[int]:
        first = step * self.batch_size
        out = []
        while len(out) < self.batch_size:
            epoch, offset = divmod(first + len(out), self.n)
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.extend(perm[offset : offset + self.batch_size - len(out)].tolist())
        return out[self.rank :: self.world]

    def __iter__(self):
        for step in range(self.start_step, self.steps):
            yield self.batch(step)

    def __len__(self) -> int:
        return self.steps - self.start_step


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


# --- building the policy ---------------------------------------------------------------------------------------
def build_policy(cfg: TrainConfig, info: data.DatasetInfo, train_episodes: list[int]) -> VLAPolicy:
    """Normalisers from the dataset's stats, the tokenizer fitted on the training episodes' chunks, a new model."""
    root, horizon = cfg.dataset_root, cfg.policy.time_horizon
    # Exact quantiles of the training frames: LeRobot's stats.json ones are too narrow (see data.load_stats).
    stats = data.frame_stats(root, ["action", "observation.state"], episodes=train_episodes)
    action_norm = at.Normalizer.from_stats(stats["action"], "quantile")
    state_norm = at.Normalizer.from_stats(stats["observation.state"], "quantile")
    chunks, _ = data.action_chunks(root, horizon, episodes=train_episodes)
    tokenizer = cfg.tokenizer.build(action_norm.normalize(chunks))
    options = asdict(cfg.policy)
    # The compact vocabulary gives the prompt's words one id each (PaliGemma's own tokenizer already does).
    words = [] if cfg.policy.backbone_path else prompt_words(info.tasks)
    config = VLAConfig(
        **{k: v for k, v in options.items() if v is not None},
        text_words=words,
        action_dim=info.action_dim,
        state_dim=info.state_dim,
        init_seed=cfg.seed,
    )
    return VLAPolicy(config, action_tokenizer=tokenizer, action_normalizer=action_norm, state_normalizer=state_norm)


def make_loader(cfg: TrainConfig, dataset, start_step: int, rank: int, world: int) -> DataLoader:
    sampler = StepBatchSampler(len(dataset), cfg.batch_size, cfg.seed, start_step, cfg.steps, rank, world)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.num_workers)


# --- checkpoints -----------------------------------------------------------------------------------------------
def save_checkpoint(run: Path, step: int, policy: VLAPolicy, optimizer, ema: dict[str, torch.Tensor] | None) -> Path:
    """Everything needed to continue exactly, as JSON + safetensors, written atomically."""
    target = run / CHECKPOINTS / f"step_{step:07d}"
    opt_state = optimizer.state_dict()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    tensors = {}
    for idx, state in opt_state["state"].items():
        for key, value in state.items():
            tensors[f"{names[idx]}.{key}"] = value.detach().cpu().contiguous()
    with atomic_directory(target) as tmp:
        policy.save_pretrained(tmp / "policy")
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch_rng": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        if ema is not None:
            save_file({k: v.contiguous() for k, v in ema.items()}, str(tmp / "ema.safetensors"))
        state = {
            "format_version": 1,
            "step": step,
            "param_groups": opt_state["param_groups"],
            "param_names": names,
        }
        atomic_write_text(tmp / "trainer_state.json", json.dumps(state) + "\n")
    atomic_write_text(run / CHECKPOINTS / LAST, json.dumps({"step": step, "path": target.name}) + "\n")
    return target


def latest_checkpoint(run: Path) -> Path | None:
    pointer = run / CHECKPOINTS / LAST
    if not pointer.is_file():
        return None
    return run / CHECKPOINTS / read_json(pointer, "checkpoint pointer")["path"]


def load_checkpoint(path: Path, policy: VLAPolicy, optimizer) -> tuple[int, dict[str, torch.Tensor] | None]:
    """Restore optimiser, EMA and random state into a policy loaded from ``path / 'policy'``; returns the step."""
    state = read_json(path / "trainer_state.json", "checkpoint")
    tensors = load_file(str(path / "optimizer.safetensors"))
    names = state["param_names"]
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, field = key.rsplit(".", 1)
        opt_state.setdefault(names.index(name), {})[field] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    # Batches are a function of (seed, step) and numpy/python random are unused in a step; torch's is restored.
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_rng"])
    ema_path = path / "ema.safetensors"
    return state["step"], (load_file(str(ema_path)) if ema_path.is_file() else None)


# --- the loop --------------------------------------------------------------------------------------------------
def main(cfg: TrainConfig) -> dict[str, Any]:
    """Train; returns a summary (final loss, samples/s, paths). Importable so tests can run it."""
    from accelerate import Accelerator

    precision = cfg.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    accelerator = Accelerator(mixed_precision=precision)
    rank, world = accelerator.process_index, accelerator.num_processes
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must divide evenly over {world} processes")
    run = Path(cfg.output_dir)
    info = data.dataset_info(cfg.dataset_root)
    train_eps, heldout_eps = data.split_episodes(cfg.dataset_root, heldout=cfg.heldout_episodes, seed=cfg.seed)

    torch.manual_seed(cfg.seed)
    resume_from = latest_checkpoint(run) if cfg.resume else None
    if cfg.resume and resume_from is None:
        raise ValueError(f"--resume=true but {run / CHECKPOINTS} holds no checkpoint; drop --resume to start fresh")
    policy = VLAPolicy.from_pretrained(resume_from / "policy") if resume_from else build_policy(cfg, info, train_eps)
    policy.train()

    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    start_step, ema = 0, None
    if resume_from:
        start_step, ema = load_checkpoint(resume_from, policy, optimizer)
    if cfg.ema_decay > 0 and ema is None:
        ema = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg), last_epoch=start_step - 1)

    image_keys = list(cfg.policy.image_keys)
    dataset = data.ActionChunkDataset(
        cfg.dataset_root, cfg.policy.time_horizon, episodes=train_eps, image_keys=image_keys,
        backend="lerobot" if image_keys else "memory",
    )  # fmt: skip
    loader = make_loader(cfg, dataset, start_step, rank, world)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    if accelerator.is_main_process:
        run.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run / "train_config.json", json.dumps(asdict(cfg), indent=2, default=str) + "\n")
    metrics_file = run / "metrics.jsonl"
    if not resume_from and accelerator.is_main_process:
        metrics_file.unlink(missing_ok=True)

    bar = tqdm(total=cfg.steps, initial=start_step, desc="train", disable=not (cfg.progress and accelerator.is_main_process))
    history: list[dict[str, Any]] = []
    start_time, seen = time.perf_counter(), 0
    step = start_step
    for batch in loader:
        batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        with accelerator.autocast():
            loss, metrics = policy(batch)  # cross-entropy on the action suffix only
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        if ema is not None:
            decay = min(cfg.ema_decay, (1 + step) / (10 + step))  # warm-up so early weights don't dominate
            with torch.no_grad():
                for name, p in accelerator.unwrap_model(policy).named_parameters():
                    if name in ema:
                        ema[name].lerp_(p.detach(), 1 - decay)

        seen += cfg.batch_size
        row = {
            "step": step,
            "loss": float(loss.detach()),
            "grad_norm": float(grad_norm),
            "lr": scheduler.get_last_lr()[0],
            **{k: float(v) for k, v in metrics.items() if k != "loss" and isinstance(v, (int, float))},
        }
        history.append(row)
        if step % cfg.log_every == 0 or step == cfg.steps:
            row["samples_per_s"] = seen / (time.perf_counter() - start_time)
            if accelerator.is_main_process:
                with metrics_file.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            bar.set_postfix(loss=f"{row['loss']:.4f}", sps=f"{row['samples_per_s']:.0f}", refresh=False)
        bar.update(1)
        if (step % cfg.save_every == 0 or step == cfg.steps) and accelerator.is_main_process:
            save_checkpoint(run, step, accelerator.unwrap_model(policy), optimizer, ema)
    bar.close()
    elapsed = time.perf_counter() - start_time

    final = accelerator.unwrap_model(policy)
    if accelerator.is_main_process:
        if ema is not None:  # the policy people use carries the EMA weights
            with torch.no_grad():
                for name, p in final.named_parameters():
                    if name in ema:
                        p.copy_(ema[name])
        final.save_pretrained(run / "policy")
        plot_loss(metrics_file, run / "loss.png")
    return {
        "final_loss": history[-1]["loss"] if history else None,
        "losses": [r["loss"] for r in history],
        "steps": step,
        "train_seconds": elapsed,
        "samples_per_s": seen / max(elapsed, 1e-9),
        "policy_path": str(run / "policy"),
        "heldout_episodes": heldout_eps,
        "tokenizer": final.action_tokenizer.name,
    }


def plot_loss(metrics_file: Path, out: Path) -> None:
    if not metrics_file.is_file():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set(xlabel="step", ylabel="loss (action tokens)", yscale="log", title="training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# --- CLI -------------------------------------------------------------------------------------------------------
def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy (draccus config: --config_path FILE plus --key=value overrides)",
        description=__doc__,
        add_help=False,
    )
    p.set_defaults(func=_run, accepts_extra=True)


def _run(args) -> int:
    from vla.config import load_config

    extra = list(getattr(args, "extra", []))
    config_path = None
    for i, arg in enumerate(extra):
        if arg.startswith("--config_path"):
            config_path = arg.split("=", 1)[1] if "=" in arg else extra[i + 1]
            extra = extra[:i] + extra[i + (1 if "=" in arg else 2) :]
            break
    summary = main(load_config(config_path, extra))
    print(f"final loss {summary['final_loss']:.4f}, {summary['samples_per_s']:.1f} samples/s; policy in {summary['policy_path']}")
    return 0
