"""The training loop, read top to bottom: batch -> loss -> step -> log -> checkpoint.

    vla train --config_path configs/debug.yaml [--steps=200 ...]
    accelerate launch -m vla.cli train --config_path configs/paligemma-3b.yaml   # many GPUs / nodes

The action tokenizer is fitted on the training episodes (or loaded) before the first step and saved with every
checkpoint. Batches are tokenised and packed by the policy's own pipeline in the DataLoader (its ``Collate``, in
``num_workers`` worker processes), the optimiser and schedule are the policy config's LeRobot presets (the same
recipe ``lerobot-train`` uses), and the loop waits for the device only every ``log_every`` steps. Checkpoints are JSON + safetensors, written to a temporary folder and renamed, so a crash never
leaves a half-written one; ``--resume=true`` continues from the last one exactly (same batches, same optimiser
and EMA state, same random state), which a test checks against an uninterrupted run.

With ``--heldout_episodes`` > 0 the held-out episode ids are saved in ``heldout.json``, and every ``eval_every`` steps
(and at the end) ``vla.heldout`` measures the policy (its EMA weights) on a fixed subset of held-out chunks: decoded
action error per dimension against the mean-action and hold-the-state baselines, next-token accuracy, valid-chunk
rate, into ``metrics.jsonl``, the progress bar and ``heldout.png``; at the end it writes the offline report
(``offline_report.json`` / ``.md`` / ``.png``) on ``report_chunks`` of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm

from vla.checkpoints import latest_checkpoint, load_checkpoint, prepare_run, save_checkpoint
from vla.config import TrainConfig
from vla.data import columns, reader
from vla.data.torch_dataset import ActionChunkDataset, choose_backend
from vla.heldout import Heldout, plot_curves, write_report
from vla.io import atomic_write_text, save_figure, write_json
from vla.policy import VLAPolicy
from vla.policy.factory import build_policy, check_finetuning
from vla.policy.pipeline import Collate
from vla.provenance import dataset_fingerprint
from vla.run_folder import POLICY, RunFolder


class Diverged(RuntimeError):
    """Training met a non-finite loss or gradient norm."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in the training loop; ``step`` is the last step it finished."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped after step {step}")
        self.step = step


class StepBatchSampler(Sampler[list[int]]):
    """Batches as a pure function of (seed, step): epoch e is a permutation seeded by (seed, e); with ``weights``
    (one per sample) each step draws its batch with replacement, sample i with probability weights[i] / sum.

    Resuming at step k yields exactly the batches an uninterrupted run would have seen from step k on. With
    several processes each takes its slice ``batch[rank::world]`` of the global batch.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        seed: int,
        start_step: int,
        steps: int,
        rank: int = 0,
        world: int = 1,
        weights: np.ndarray | None = None,
    ):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.start_step, self.steps, self.rank, self.world = start_step, steps, rank, world
        self.p = None
        if weights is not None:
            weights = np.asarray(weights, dtype=np.float64)
            if weights.shape != (n,) or not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
                raise ValueError(
                    f"sampling weights must be {n} finite numbers >= 0, not all 0 (got shape {weights.shape})"
                )
            self.p = weights / weights.sum()

    def batch(self, step: int) -> list[int]:
        if self.p is not None:
            out = np.random.default_rng([self.seed, step]).choice(self.n, size=self.batch_size, p=self.p).tolist()
            return out[self.rank :: self.world]
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


def task_weights(dataset: ActionChunkDataset) -> np.ndarray:
    """[N] sampling weights that draw every task equally often: a sample weighs 1 / its task's samples."""
    tasks = columns.frame_tasks(dataset.info, episodes=dataset.episodes)
    if len(tasks) != len(dataset):
        raise RuntimeError(f"{len(tasks)} frames' tasks for {len(dataset)} samples; the dataset's files disagree")
    return 1.0 / np.bincount(tasks)[tasks]


def make_loader(cfg: TrainConfig, dataset, policy: VLAPolicy, start_step: int, rank: int, world: int) -> DataLoader:
    """Batches as a function of the step, tokenised and packed by the policy's pipeline in the loader's workers."""
    weights = task_weights(dataset) if cfg.balance_tasks else None
    sampler = StepBatchSampler(len(dataset), cfg.batch_size, cfg.seed, start_step, cfg.steps, rank, world, weights)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=Collate(policy.pipeline.training),
        num_workers=cfg.num_workers,
        worker_init_fn=_one_thread if cfg.num_workers else None,
        persistent_workers=cfg.num_workers > 0,
    )


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)  # a worker tokenises one batch at a time; threads would fight the main process


class EMA:
    """An exponential moving average of the trainable weights: the weights the saved policy carries. Its decay warms
    up as ``min(decay, (1 + step) / (10 + step))``, so that the first steps' weights do not dominate."""

    def __init__(self, tensors: dict[str, torch.Tensor], decay: float) -> None:
        self.tensors, self.decay = tensors, decay

    @classmethod
    def of(cls, model: torch.nn.Module, decay: float) -> EMA:
        return cls({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, decay)

    def update(self, model: torch.nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in self.tensors:
                    self.tensors[name].lerp_(p.detach(), 1 - decay)

    def copy_into(self, model: torch.nn.Module) -> None:
        _copy_weights(model, self.tensors)

    @contextlib.contextmanager
    def swapped_in(self, model: torch.nn.Module):
        """The EMA weights in ``model`` for the block; its own weights restored after."""
        own = {n: p.detach().clone() for n, p in model.named_parameters() if n in self.tensors}
        self.copy_into(model)
        try:
            yield
        finally:
            _copy_weights(model, own)


def _copy_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in weights:
                p.copy_(weights[name])


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor (and the packed ``Sequence``) of a batch on ``device``."""
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


@dataclass
class Optimization:
    """What takes a step: the optimiser over the trainable parameters, its schedule and the gradient clip."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    params: list[torch.nn.Parameter]
    clip_norm: float


@dataclass
class Progress:
    """Where the loop got to: the last step taken, the logged losses, samples seen and seconds spent."""

    step: int
    losses: list[float] = field(default_factory=list)
    seen: int = 0
    seconds: float = 0.0


# --- the run ---------------------------------------------------------------------------------------------------
def main(cfg: TrainConfig) -> dict[str, Any]:
    """Train; returns a summary (final loss, samples/s, paths). Importable so tests can run it."""
    accelerator = make_accelerator(cfg)
    cfg, info, train_eps, heldout_eps = resolve(cfg, accelerator)
    run = RunFolder(cfg.output_dir)
    encoded, resume_from, fingerprint = start_run(run, cfg, accelerator)
    torch.manual_seed(cfg.seed)
    policy = VLAPolicy.from_pretrained(resume_from / POLICY) if resume_from else build_policy(cfg, info, train_eps)
    policy.train()
    if not resume_from:
        say_choices(policy, encoded, accelerator)
    opt = make_optimization(cfg, policy, accelerator)
    start_step, ema = restore(resume_from, policy, opt, cfg.ema_decay)
    dataset = training_dataset(cfg, info, policy, train_eps, accelerator)
    loader = make_loader(cfg, dataset, policy, start_step, accelerator.process_index, accelerator.num_processes)
    policy, opt.optimizer = accelerator.prepare(policy, opt.optimizer)
    heldout = None
    if accelerator.is_main_process:  # accepted (fresh, or a resume with the run's own settings): recorded
        run.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.config, json.dumps(encoded, indent=2, default=str) + "\n")
        write_json(run.dataset, fingerprint)  # the data it trains on: a resume must find the same
        if heldout_eps:  # a fixed subset of held-out chunks, read once, measured by the main process
            heldout = Heldout.build(
                info, heldout_eps, train_eps, accelerator.unwrap_model(policy).config, cfg.eval_chunks
            )
            ids = {"heldout_episodes": heldout_eps, "train_episodes": train_eps, "eval_chunks": len(heldout)}
            write_json(run.heldout, ids)
    progress = Progress(start_step)
    try:
        train_steps(cfg, accelerator, policy, opt, ema, loader, progress, run, heldout, measuring=bool(heldout_eps))
        final = accelerator.unwrap_model(policy)
        return finish(cfg, accelerator, final, opt, ema, progress, run, info, train_eps, heldout_eps)
    except KeyboardInterrupt as err:  # said by `vla train` with where the run stands
        raise Interrupted(progress.step) from err


def train_steps(
    cfg,
    accelerator,
    policy,
    opt: Optimization,
    ema: EMA | None,
    loader,
    progress: Progress,
    run: RunFolder,
    heldout: Heldout | None,
    measuring: bool,
) -> Progress:
    """The loop: batch -> loss -> step -> EMA, then, every ``log_every`` steps (the only waits for the device), the
    finiteness check, a metrics row and, every ``eval_every`` when ``measuring``, the held-out measurement (by the
    main process, which holds ``heldout``); a checkpoint every ``save_every``."""
    bar = tqdm(
        total=cfg.steps, initial=progress.step, desc="train", disable=not (cfg.progress and accelerator.is_main_process)
    )
    pending: list[dict[str, torch.Tensor]] = []  # per step, on the device until the next log
    postfix: dict[str, str] = {}
    start = time.perf_counter()
    for batch in loader:
        batch = to_device(batch, accelerator.device)
        with accelerator.autocast():
            loss, metrics = policy(batch, compiled=cfg.compile)  # cross-entropy on the action suffix only
        opt.optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss * global_loss_weight(accelerator, loss, metrics))
        grad_norm = accelerator.clip_grad_norm_(opt.params, opt.clip_norm)
        opt.optimizer.step()
        opt.scheduler.step()
        progress.step += 1
        step = progress.step
        if ema is not None:
            ema.update(accelerator.unwrap_model(policy), step)
        progress.seen += cfg.batch_size
        pending.append({**metrics, "grad_norm": torch.as_tensor(grad_norm).detach()})
        bar.update(1)
        saving = step % cfg.save_every == 0 or step == cfg.steps
        evaluating = measuring and (step % cfg.eval_every == 0 or step == cfg.steps)
        if step % cfg.log_every == 0 or step == cfg.steps or saving or evaluating:
            rows = [{k: float(v) for k, v in m.items()} for m in pending]
            check_finite(rows, step, run)
            pending = []
            progress.losses.extend(r["loss"] for r in rows)
            row = metrics_row(rows, step, opt.scheduler.get_last_lr()[0], progress.seen / (time.perf_counter() - start))
            if evaluating and heldout is not None:  # the weights the saved policy will carry (EMA when on)
                measures = measure_heldout(heldout, accelerator, accelerator.unwrap_model(policy), ema)
                row, postfix = row | measures, heldout_postfix(measures)
            if evaluating:
                accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                with run.metrics.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            bar.set_postfix(loss=f"{row['loss']:.4f}", sps=f"{row['samples_per_s']:.0f}", **postfix, refresh=False)
        if saving and accelerator.is_main_process:
            save_checkpoint(
                run.path,
                step,
                accelerator.unwrap_model(policy),
                opt.optimizer,
                ema.tensors if ema is not None else None,
                keep_last=cfg.keep_last,
            )
    bar.close()
    progress.seconds = time.perf_counter() - start
    return progress


# --- set-up ----------------------------------------------------------------------------------------------------
def make_accelerator(cfg: TrainConfig):
    """accelerate's ``Accelerator`` for the run (bf16 on a GPU that has it under ``mixed_precision="auto"``); FSDP and
    a batch that does not split evenly over the processes refused before any work."""
    from accelerate import Accelerator, DistributedDataParallelKwargs, DistributedType

    precision = cfg.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    # cpu=True is what makes accelerate join processes started by torchrun / accelerate launch on a machine without a
    # GPU (gloo); without cameras the vision tower is never run, which DDP must be told about.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=not cfg.policy.image_keys)
    accelerator = Accelerator(mixed_precision=precision, cpu=cfg.policy.device == "cpu", kwargs_handlers=[ddp])
    if accelerator.distributed_type == DistributedType.FSDP:  # refused now, not at the first save hours later
        raise ValueError(
            "vla train cannot save FSDP-sharded runs yet (its checkpoints and EMA need whole tensors); "
            "launch without the FSDP config (accelerate launch --num_processes N: DDP, about 60 GB per "
            "GPU for the 3B shape's weights, gradients and AdamW state before activations)"
        )
    if cfg.batch_size % accelerator.num_processes:
        raise ValueError(f"batch_size {cfg.batch_size} must divide evenly over {accelerator.num_processes} processes")
    return accelerator


def resolve(cfg: TrainConfig, accelerator) -> tuple[TrainConfig, Any, list[int], list[int]]:
    """The config with its unset settings chosen from the dataset (a fine-tuned policy's settings stand as trained),
    the dataset's metadata (its rows checked against it first), and the training and held-out episodes."""
    info = reader.dataset_info(cfg.dataset_root)  # meta/ read once, passed on
    reader.check_frames(info)  # the data rows agree with meta/: refused before anything is written
    saved_policy = cfg.policy if cfg.policy.pretrained_path is not None else None  # fine-tuning (--policy.path)
    if saved_policy is not None and not cfg.resume:  # the saved policy fits the data: checked before any change
        check_finetuning(cfg, info)
    cfg = cfg.resolved(info, log=print if accelerator.is_main_process else None)  # unset settings from the data
    if saved_policy is not None:  # a saved policy's settings stand as trained: nothing is chosen for them
        cfg = dataclasses.replace(cfg, policy=saved_policy)
    train_eps, heldout_eps = reader.split_episodes(info, heldout=cfg.heldout_episodes, seed=cfg.seed)
    return cfg, info, train_eps, heldout_eps


def start_run(run: RunFolder, cfg: TrainConfig, accelerator) -> tuple[dict[str, Any], Path | None, dict | None]:
    """The config as the run folder keeps it, the checkpoint to resume from (None for a fresh start) and the
    fingerprint of the dataset (None off the main process); the folder is checked (one run per folder, a resume on
    its own data) by the main process before any work."""
    encoded = draccus.encode(cfg)
    resume_from, fingerprint = None, None
    if accelerator.is_main_process:
        fingerprint = dataset_fingerprint(cfg.dataset_root)
        resume_from = prepare_run(
            run.path, encoded, resume=cfg.resume, overwrite=cfg.overwrite, fingerprint=fingerprint, log=print
        )
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        resume_from = latest_checkpoint(run.path) if cfg.resume else None
    return encoded, resume_from, fingerprint


def say_choices(policy: VLAPolicy, encoded: dict[str, Any], accelerator) -> None:
    """What the tokenizer's fit chose from the data: said, and kept with the run's other choices."""
    for name, (value, why) in policy.action_tokenizer.fit_choices.items():
        encoded.setdefault("chosen", {})[f"tokenizer.{name}"] = f"{value}: {why}"
    for line in policy.action_tokenizer.choices():
        if accelerator.is_main_process:
            print(f"chose tokenizer.{line}")


def make_optimization(cfg: TrainConfig, policy: VLAPolicy, accelerator) -> Optimization:
    """LeRobot's presets from the policy config: the same optimiser and schedule as under lerobot-train. Its AdamW
    runs as one fused kernel over every tensor where torch has one (CPU, CUDA): the same update, ~4x faster than the
    per-tensor loop on CPU for tiny. LeRobot shrinks its warm-up and decay to a run shorter than
    ``scheduler_decay_steps``; here the schedule is a function of the step alone, so a run resumed with more
    ``--steps`` continues the schedule it started (a run that ends before it decays is warned about)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    preset = dataclasses.asdict(policy.config.get_optimizer_preset())
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params) or None
    optimizer = torch.optim.AdamW(params, **{k: v for k, v in preset.items() if k != "grad_clip_norm"}, fused=fused)
    decay = policy.config.scheduler_decay_steps
    scheduler = policy.config.get_scheduler_preset().build(optimizer, max(cfg.steps, decay))
    if accelerator.is_main_process and cfg.steps < decay:  # said before any step
        share = scheduler.lr_lambdas[0](cfg.steps)  # the schedule is a function of the step: its last step's share
        print(f"WARNING: {short_schedule(cfg.steps, decay, share)}")
    return Optimization(optimizer, scheduler, params, policy.config.optimizer_grad_clip_norm)


def restore(resume_from: Path | None, policy: VLAPolicy, opt: Optimization, ema_decay: float) -> tuple[int, EMA | None]:
    """The step to start from and the EMA: a checkpoint's (its optimiser, EMA and random state restored, the schedule
    set to its step), else step 0 and a fresh EMA (``ema_decay`` > 0)."""
    start_step, tensors = 0, None
    if resume_from:
        start_step, tensors = load_checkpoint(resume_from, policy, opt.optimizer)
        with warnings.catch_warnings():  # the schedule is a function of the step: set it to the checkpoint's
            warnings.simplefilter("ignore", UserWarning)  # "scheduler.step() before optimizer.step()": intended
            opt.scheduler.last_epoch = start_step - 1
            opt.scheduler.step()
    if tensors is not None:
        return start_step, EMA(tensors, ema_decay)
    return start_step, EMA.of(policy, ema_decay) if ema_decay > 0 else None


def training_dataset(cfg: TrainConfig, info, policy: VLAPolicy, train_eps: list[int], accelerator):
    """The training chunks; cameras decoded once into memory when their frames fit the budget (at the policy's image
    size), else read through LeRobot."""
    image_keys, image_size = list(policy.config.image_keys), policy.model.image_size
    backend, why = choose_backend(info, image_keys, image_size, train_eps)
    if accelerator.is_main_process:
        print(f"dataset backend: {backend} ({why})")
    return ActionChunkDataset(
        info,
        policy.config.time_horizon,
        episodes=train_eps,
        image_keys=image_keys,
        image_size=image_size,
        backend=backend,
        progress=cfg.progress and accelerator.is_main_process,
        obs_steps=policy.config.n_obs_steps,
    )


# --- in the loop -----------------------------------------------------------------------------------------------
def global_loss_weight(accelerator, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> Any:
    """The factor on this process's loss under DDP, which averages the processes' gradients: each one's mean weighted
    by its share of the suffix tokens (FAST's chunks differ in length), so that the step is the one a single process
    takes on the global batch; ``metrics["loss"]`` becomes the global batch's. 1 for a single process."""
    world = accelerator.num_processes
    if world == 1:
        return 1.0
    tokens = metrics["suffix_tokens"].to(loss.device)
    total, summed = accelerator.reduce(torch.stack([tokens, loss.detach() * tokens]), "sum")
    metrics["loss"] = summed / total
    return tokens * world / total


def check_finite(rows: list[dict[str, float]], step: int, run: RunFolder) -> None:
    """Raise ``Diverged`` naming the first of ``rows`` (the steps up to ``step``) whose loss or gradient norm is not
    finite, the last good checkpoint and the fix; nothing after it is saved."""
    first_bad = next(
        (
            step - len(rows) + 1 + i
            for i, r in enumerate(rows)
            if not (np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]))
        ),
        None,
    )
    if first_bad is None:
        return
    last = run.saved_checkpoints()
    again = (
        "start again with --overwrite=true or in another --output_dir"
        if last
        else "run again in place (the folder holds no checkpoint, so it starts over)"
    )
    raise Diverged(
        f"training diverged at step {first_bad}: the loss or the gradient norm is not finite; the last "
        f"good checkpoint is {last[-1] if last else 'none (none was saved yet)'}. Lower "
        f"--policy.optimizer_lr (or raise --policy.scheduler_warmup_steps) and {again}"
    )


def metrics_row(rows: list[dict[str, float]], step: int, lr: float, samples_per_s: float) -> dict[str, Any]:
    """One ``metrics.jsonl`` row: the last step's metrics, the learning rate, the rate so far and the mean loss over
    the steps since the last row."""
    return {
        "step": step,
        **rows[-1],
        "lr": lr,
        "samples_per_s": samples_per_s,
        "loss_mean": float(np.mean([r["loss"] for r in rows])),
    }


def measure_heldout(heldout: Heldout, accelerator, model: VLAPolicy, ema: EMA | None) -> dict[str, Any]:
    """The held-out measures of ``model`` with the weights the saved policy will carry (EMA when on)."""
    with accelerator.autocast(), ema.swapped_in(model) if ema is not None else contextlib.nullcontext():
        return heldout.measure(model)


def heldout_postfix(row: dict[str, Any]) -> dict[str, str]:
    """The progress bar's held-out figures."""
    hold = row["heldout_hold_state_rmse"]
    return {
        "heldout": f"{row['heldout_rmse']:.3f}",
        "mean": f"{row['heldout_mean_action_rmse']:.3f}",
        "hold": "n/a" if hold is None else f"{hold:.3f}",
        "acc": f"{row['heldout_accuracy']:.2f}",
    }


# --- the end ---------------------------------------------------------------------------------------------------
def finish(
    cfg: TrainConfig,
    accelerator,
    final: VLAPolicy,
    opt: Optimization,
    ema: EMA | None,
    progress: Progress,
    run: RunFolder,
    info,
    train_eps: list[int],
    heldout_eps: list[int],
) -> dict[str, Any]:
    """The policy saved with the EMA weights, the loss plot, the offline report (on more held-out chunks, of the policy
    as saved) and the run's last lines; the summary ``main`` returns."""
    losses = progress.losses
    if not losses:  # resumed at the final step (a kill during the final save): no step ran
        rows = run.metrics_rows()
        losses = [rows[-1]["loss"]] if rows else []
    final_loss = losses[-1] if losses else float("nan")
    samples_per_s = progress.seen / max(progress.seconds, 1e-9)
    if accelerator.is_main_process:
        if ema is not None:  # the policy people use carries the EMA weights
            ema.copy_into(final)
        final.save_pretrained(run.policy)
        plot_loss(run)
        report = None
        if heldout_eps:
            plot_curves(run)
            report = Heldout.build(info, heldout_eps, train_eps, final.config, cfg.report_chunks).report(
                final, dataset=str(info.root), steps=progress.step, final_train_loss=losses[-1] if losses else None
            )
            write_report(report, run.path)
            print(f"report in {run.report('.md')}")
        print(f"final loss {final_loss:.4f}, {samples_per_s:.1f} samples/s; policy in {run.policy}")
        lr = (opt.scheduler.get_last_lr()[0], policy_lr(final), final.config.scheduler_decay_steps)
        for line in final_lines(report, run, cfg, progress.step, *lr):
            print(line)  # the verdict and what to do next, last
    return {
        "final_loss": final_loss,
        "losses": losses,
        "steps": progress.step,
        "train_seconds": progress.seconds,
        "samples_per_s": samples_per_s,
        "policy_path": str(run.policy),
        "heldout_episodes": heldout_eps,
        "tokenizer": final.action_tokenizer.name,
    }


# --- the last lines ----------------------------------------------------------------------------------------------
def short_schedule(steps: int, decay_steps: int, share: float) -> str:
    """Why a run of ``steps`` under a schedule that decays over ``decay_steps`` ends at ``share`` of its peak
    learning rate, not at the decay's low end."""
    return (
        f"--steps={steps} ends before the learning-rate schedule has decayed (policy.scheduler_decay_steps="
        f"{decay_steps}): its last step runs at {share:.0%} of the peak learning rate; pass "
        f"--policy.scheduler_decay_steps={steps} to decay within the run"
    )


def policy_lr(policy) -> float:
    """The peak learning rate of ``policy``'s optimiser preset."""
    return float(policy.config.get_optimizer_preset().lr)


def final_lines(
    report: dict[str, Any] | None,
    run: RunFolder,
    cfg: TrainConfig,
    steps: int,
    lr: float,
    peak: float,
    decay: int | None,
) -> list[str]:
    """The run's last lines: the offline verdict (does the policy beat the mean action and holding the state on the
    held-out episodes?), how far the learning-rate schedule (decaying over ``decay`` steps) got, and the next step."""
    lines, policy = [], run.policy
    if decay is not None and steps < decay:
        lines.append(
            f"learning rate at the end: {lr:.2g}, {lr / peak:.0%} of its peak: the schedule decays over "
            f"{decay} steps (policy.scheduler_decay_steps) and the run stopped at {steps}"
        )
    if report is None:
        lines.append(
            "offline verdict: none, no episode was held out; pass --heldout_episodes=0.1 to measure the "
            "policy against the mean action and holding the state"
        )
        return lines
    p, base, hold = report["policy"], report["baselines"], report["baselines"]["hold_state"]
    episodes = len(report["heldout_episodes"])

    def said(beats: bool) -> str:
        return "yes" if beats else "no"

    parts = [
        f"beats the mean action: {said(report['beats_mean_action'])} ({p['rmse']:.3f} vs "
        f"{base['mean_action']['rmse']:.3f})"
    ]
    if hold is None:
        parts.append(f"holding the state: not defined ({report['hold_state_undefined_because']})")
    else:
        parts.append(
            f"beats holding the state: {said(report['beats_hold_state'])} ({p['rmse']:.3f} vs {hold['rmse']:.3f})"
        )
    few = f", {episodes} held-out episode{'s' if episodes != 1 else ''}" + (" (a noisy verdict)" * (episodes < 3))
    lines.append(f"offline verdict: {'; '.join(parts)}; held-out RMSE, normalised{few}")
    if not report["beats_mean_action"]:
        nxt = (
            f"the policy predicts worse than the average action: train longer (--steps={2 * steps}), and read "
            f"`vla data info {cfg.dataset_root}` for what in the data hurts"
        )
    elif report["beats_hold_state"] is False:
        nxt = (
            f"train longer (--steps={2 * steps}) or record more episodes; a policy that does not beat holding the "
            "state will mostly stand still on the robot"
        )
    else:
        nxt = f"run it: vla serve --policy {policy} (on a robot), or vla eval --policy {policy} (in a simulator)"
    if decay is not None and steps < decay:
        nxt += f"; and set --policy.scheduler_decay_steps to the run's steps (it had not decayed by step {steps})"
    lines.append(f"next: {nxt}")
    return lines


def plot_loss(run: RunFolder) -> None:
    """The training loss against the step (``loss.png``)."""
    rows = run.metrics_rows()
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set(xlabel="step", ylabel="loss (action tokens)", yscale="log", title="training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, run.loss_plot)
