"""Held-out measurement: how far the policy's decoded chunks are from the held-out episodes' own, against two
baselines any policy should beat; measured during training and written as the offline report at its end (the check
for a dataset without a simulator).

    heldout = Heldout.build(info, heldout_eps, train_eps, policy.config, n_chunks=64)   # a fixed subset, read once
    row = heldout.measure(policy)        # {"heldout_rmse": ..., "heldout_accuracy": ..., ...}, for metrics.jsonl
    report = heldout.report(policy)      # more: per horizon step, decode latency, the baselines in full
    write_report(report, run_dir)        # offline_report.json / .md / .png

What is measured, on the fixed subset (chunks evenly spaced through the held-out episodes, so every measurement
sees the same ones):
    rmse, mae          decoded chunk against the recorded one, per action dimension, over the steps inside the
                       episode (padding excluded): in the data's units (``*_raw``) and normalised, i.e. divided by
                       half the training frames' q01..q99 range of the *absolute* action, whatever the policy
                       predicts (so absolute and relative actions are compared on one scale). ``heldout_rmse`` is
                       the mean over dimensions of the normalised RMSE.
    accuracy, loss     teacher-forced next-token accuracy and cross-entropy on the held-out chunks' action ids
    valid_rate         the share of greedy, constrained decodes that gave a chunk
Baselines (errors only):
    mean_action        every step the training frames' mean action
    hold_state         every step the current state's matching dimensions (``VLAConfig.action_state_dims``): the
                       robot stays where it is. Not defined when the state does not hold the action's quantities.

Decoding is the policy's own ``predict_action_chunk`` (its prompt and output pipelines), in batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import action_tokenizers as at
import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data import reader
from vla.data.stats import frame_stats
from vla.data.torch_dataset import ActionChunkDataset
from vla.io import atomic_write_text, save_figure, write_json
from vla.policy.pipeline import IMAGES, SEQUENCE, current_state, packed, run
from vla.run_folder import RunFolder

BATCH = 64  # chunks decoded at once
LATENCY_CHUNKS = 16  # single-observation decodes timed for the report


@dataclass
class Heldout:
    """A fixed subset of held-out chunks and what the baselines score on it (computed once)."""

    batch: dict[str, Any]  # the observations, collated: observation.state [N, S], task, cameras
    target: np.ndarray  # float64 [N, T, D] the recorded chunks (absolute, raw units)
    inside: np.ndarray  # bool [N, T] steps inside the episode (padding excluded from every error)
    scale: np.ndarray  # float64 [D] half the training frames' q01..q99 range: the normalised unit
    episodes: list[int]  # the held-out episodes
    action_names: list[str]
    baselines: dict[str, dict[str, Any] | None]  # mean_action, hold_state (None: not defined, see why_no_hold)
    why_no_hold: str | None

    @classmethod
    def build(
        cls, info: reader.DatasetInfo, episodes: list[int], train_episodes: list[int], config, n_chunks: int
    ) -> Heldout:
        """``n_chunks`` chunks evenly spaced through ``episodes``' (all when fewer); ``config`` the policy's
        (resolved) ``VLAConfig``; the mean action and the normalised unit from ``train_episodes``' frames."""
        if not episodes:
            raise ValueError("held-out measurement needs held-out episodes; set --heldout_episodes (e.g. 0.1)")
        image_keys = list(config.image_keys)
        ds = ActionChunkDataset(
            info,
            config.time_horizon,
            episodes=episodes,
            image_keys=image_keys,
            backend="lerobot" if image_keys else "memory",
            obs_steps=config.n_obs_steps,
        )
        picked = np.unique(np.linspace(0, len(ds) - 1, min(n_chunks, len(ds))).round().astype(int))
        batch = torch.utils.data.default_collate([ds[int(i)] for i in picked])
        target = batch.pop(ACTION).double().numpy()  # [N, T, D]
        inside = ~batch.pop(f"{ACTION}_is_pad").numpy()  # [N, T]
        stats = frame_stats(info, [ACTION], episodes=train_episodes)[ACTION]
        scale = at.Normalizer.from_stats(stats, "quantile").scale.astype(np.float64)
        names = info.action_names or [f"action[{i}]" for i in range(target.shape[2])]
        mean = np.broadcast_to(stats["mean"], target.shape)
        baselines: dict[str, dict[str, Any] | None] = {"mean_action": errors(mean, target, inside, scale)}
        why = None
        if config.action_state_dims is None:
            why = (
                f"the state ({info.state_dim}-D) does not hold the action's quantities ({info.action_dim}-D) by "
                "name or dimension; set policy.action_state_dims to define it"
            )
            baselines["hold_state"] = None
        else:
            state = current_state(batch[OBS_STATE].double().numpy())[:, list(config.action_state_dims)]  # [N, D]
            hold = np.broadcast_to(state[:, None, :], target.shape)
            baselines["hold_state"] = errors(hold, target, inside, scale)
        return cls(batch, target, inside, scale, list(episodes), names, baselines, why)

    def __len__(self) -> int:
        return len(self.target)

    @torch.no_grad()
    def decode(self, policy) -> tuple[np.ndarray, np.ndarray, float]:
        """Greedy, constrained chunks for every observation: (chunks [N, T, D], valid [N], tokens per chunk)."""
        chunks, valid, tokens = [], [], []
        for lo in range(0, len(self), BATCH):
            part = {k: v[lo : lo + BATCH] for k, v in self.batch.items()}
            chunks.append(policy.predict_action_chunk(part).double().cpu().numpy())
            valid.append(policy.last_decode_info.valid)
            tokens.append(policy.last_decode_info.tokens_per_chunk)
        return np.concatenate(chunks), np.concatenate(valid), float(np.concatenate(tokens).mean())

    @torch.no_grad()
    def teacher_forced(self, policy) -> dict[str, float]:
        """Cross-entropy and next-token accuracy on the held-out chunks' action ids (the training loss, held out)."""
        losses, hits, n = [], [], 0
        for lo in range(0, len(self), BATCH):
            part = {k: v[lo : lo + BATCH] for k, v in self.batch.items()}
            part[ACTION] = torch.as_tensor(self.target[lo : lo + BATCH])
            b = packed(run(policy.pipeline.measuring, part))
            images = b[IMAGES].to(policy.model.device) if IMAGES in b else None  # the sequence moves itself
            loss, metrics = policy.model.loss(b[SEQUENCE], images)
            m = len(part[ACTION])
            losses.append(float(loss) * m)
            hits.append(float(metrics["accuracy"]) * m)
            n += m
        return {"loss": sum(losses) / n, "accuracy": sum(hits) / n}

    def measure(self, policy) -> dict[str, Any]:
        """One metrics row (``heldout_*`` keys): the policy's errors and scores, and the baselines' RMSE."""
        start = time.perf_counter()
        with _evaluating(policy):
            chunks, valid, tokens = self.decode(policy)
            forced = self.teacher_forced(policy)
        err = errors(chunks, self.target, self.inside, self.scale)
        hold = self.baselines["hold_state"]
        return {
            "heldout_rmse": err["rmse"],
            "heldout_mae": err["mae"],
            "heldout_rmse_per_dim": err["rmse_per_dim"],
            "heldout_rmse_raw_per_dim": err["rmse_raw_per_dim"],
            "heldout_accuracy": forced["accuracy"],
            "heldout_loss": forced["loss"],
            "heldout_valid_rate": float(valid.mean()),
            "heldout_tokens_per_chunk": tokens,
            "heldout_mean_action_rmse": self.baselines["mean_action"]["rmse"],
            "heldout_hold_state_rmse": None if hold is None else hold["rmse"],
            "heldout_seconds": time.perf_counter() - start,
        }

    def report(self, policy, **about: Any) -> dict[str, Any]:
        """The offline report: the policy's errors in full (per dimension, per horizon step), its scores, its decode
        latency (one observation at a time, p50), the baselines, and whether it beats them. ``about``: run facts."""
        with _evaluating(policy):
            chunks, valid, tokens = self.decode(policy)
            forced = self.teacher_forced(policy)
            latencies = []
            for i in range(min(LATENCY_CHUNKS, len(self))):
                policy.predict_action_chunk({k: v[i : i + 1] for k, v in self.batch.items()})
                latencies.append(policy.last_decode_info.latency_ms)
        err = errors(chunks, self.target, self.inside, self.scale)
        hold = self.baselines["hold_state"]
        c = policy.config
        return {
            **about,
            "heldout_episodes": self.episodes,
            "n_chunks": len(self),
            "time_horizon": c.time_horizon,
            "action_names": self.action_names,
            "relative_actions": c.relative_actions,
            "action_state_dims": c.action_state_dims,
            "attention": c.attention,
            "tokenizer": policy.action_tokenizer.name,
            "policy": {
                **err,
                **forced,
                "valid_rate": float(valid.mean()),
                "tokens_per_chunk": tokens,
                "latency_ms_p50": float(np.median(latencies)),
            },
            "baselines": {"mean_action": self.baselines["mean_action"], "hold_state": hold},
            "hold_state_undefined_because": self.why_no_hold,
            "beats_mean_action": bool(err["rmse"] < self.baselines["mean_action"]["rmse"]),
            "beats_hold_state": None if hold is None else bool(err["rmse"] < hold["rmse"]),
        }


class _evaluating:
    """Eval mode and untouched decode counters for the measurement; the previous mode restored after."""

    def __init__(self, policy):
        self.policy = policy

    def __enter__(self):
        self.training, self.stats = self.policy.training, self.policy.decode_stats
        self.policy.decode_stats = type(self.stats)()
        self.policy.eval()

    def __exit__(self, *exc):
        self.policy.train(self.training)
        self.policy.decode_stats = self.stats


def errors(pred: np.ndarray, target: np.ndarray, inside: np.ndarray, scale: np.ndarray) -> dict[str, Any]:
    """RMSE and MAE of chunks ``pred`` against ``target`` (both [N, T, D]) over the steps ``inside`` [N, T]: per
    dimension raw and normalised (divided by ``scale`` [D]), the mean over dimensions of the normalised ones, and the
    normalised RMSE per horizon step."""
    diff = np.asarray(pred, dtype=np.float64) - target  # [N, T, D]
    w = inside[..., None].astype(np.float64)  # [N, T, 1]
    n = max(float(inside.sum()), 1.0)
    rmse_raw = np.sqrt((w * diff**2).sum((0, 1)) / n)  # [D]
    mae_raw = (w * np.abs(diff)).sum((0, 1)) / n  # [D]
    per_step = np.sqrt(((w * (diff / scale) ** 2).sum(0) / np.maximum(w.sum(0), 1.0)).mean(-1))  # [T]
    return {
        "rmse": float((rmse_raw / scale).mean()),
        "mae": float((mae_raw / scale).mean()),
        "rmse_per_dim": (rmse_raw / scale).tolist(),
        "mae_per_dim": (mae_raw / scale).tolist(),
        "rmse_raw_per_dim": rmse_raw.tolist(),
        "mae_raw_per_dim": mae_raw.tolist(),
        "rmse_per_step": per_step.tolist(),
    }


# --- outputs ---------------------------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    """The offline report as a markdown summary and a per-dimension table."""
    p, b = report["policy"], report["baselines"]
    hold = b["hold_state"]

    def verdict(beats: bool | None) -> str:
        return "not defined" if beats is None else ("yes" if beats else "**no**")

    lines = [
        f"# Offline report: {report.get('dataset', '')}",
        "",
        f"{report['n_chunks']} held-out chunks (T={report['time_horizon']}) from episodes {report['heldout_episodes']}; "
        f"tokenizer {report['tokenizer']}, attention {report['attention']}, relative actions "
        f"{report['relative_actions']}.",
        "",
        f"- held-out RMSE (normalised, mean over dims): **{p['rmse']:.4f}** (MAE {p['mae']:.4f})",
        f"- mean-action baseline: {b['mean_action']['rmse']:.4f}; beats it: {verdict(report['beats_mean_action'])}",
        "- hold-state baseline: "
        + (
            f"{hold['rmse']:.4f}; beats it: {verdict(report['beats_hold_state'])}"
            if hold
            else f"not defined ({report['hold_state_undefined_because']})"
        ),
        f"- next-token accuracy {p['accuracy']:.3f}, held-out loss {p['loss']:.4f}, valid chunks {p['valid_rate']:.1%}, "
        f"{p['tokens_per_chunk']:.1f} tokens per chunk, decode latency {p['latency_ms_p50']:.1f} ms (p50, one observation)",
        "",
        "| dimension | RMSE | RMSE (data units) | MAE (data units) | mean action RMSE | hold state RMSE |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, name in enumerate(report["action_names"]):
        h = f"{hold['rmse_per_dim'][i]:.4f}" if hold else "n/a"
        lines.append(
            f"| {name} | {p['rmse_per_dim'][i]:.4f} | {p['rmse_raw_per_dim'][i]:.3f} | "
            f"{p['mae_raw_per_dim'][i]:.3f} | {b['mean_action']['rmse_per_dim'][i]:.4f} | {h} |"
        )
    return "\n".join(lines) + "\n\nRMSE columns without units are normalised (half the training q01..q99 range).\n"


def write_report(report: dict[str, Any], out_dir: Path) -> None:
    """``offline_report.json``, ``.md`` and ``.png`` in the run folder ``out_dir`` (error per dimension and per horizon
    step, with the baselines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    if "provenance" not in report:  # what produced it: the run's config (beside the report) and its dataset
        from vla.provenance import provenance

        config = RunFolder(out_dir).train_config()
        root = report.get("dataset")
        report = {
            **report,
            "provenance": provenance(config=config, dataset=root if root and Path(root).is_dir() else None),
        }
    run_folder = RunFolder(out_dir)
    write_json(run_folder.report(".json"), report)
    atomic_write_text(run_folder.report(".md"), markdown(report))
    rows = {"policy": report["policy"], **{k: v for k, v in report["baselines"].items() if v is not None}}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(rows)
    for k, (name, r) in enumerate(rows.items()):
        left.bar(np.arange(len(r["rmse_per_dim"])) + k * width, r["rmse_per_dim"], width, label=name)
        right.plot(np.arange(len(r["rmse_per_step"])), r["rmse_per_step"], "-o", ms=3, label=name)
    left.set_xticks(
        np.arange(len(report["action_names"])) + width * (len(rows) - 1) / 2,
        report["action_names"],
        rotation=30,
        fontsize=7,
    )
    left.set(ylabel="RMSE (normalised)", title="held-out error per dimension")
    right.set(xlabel="step in the chunk", ylabel="RMSE (normalised, mean over dims)", title="error along the chunk")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, run_folder.report(".png"))


def plot_curves(run_folder: RunFolder) -> None:
    """Training loss (and held-out loss) and held-out RMSE against the step, the baselines as lines (``heldout.png``
    in the run folder)."""
    rows = run_folder.metrics_rows()
    evals = [r for r in rows if r.get("heldout_rmse") is not None]
    if not evals:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="training")
    left.plot([r["step"] for r in evals], [r["heldout_loss"] for r in evals], "-o", ms=3, label="held-out")
    left.set(xlabel="step", ylabel="loss (action tokens)", yscale="log", title="loss")
    right.plot([r["step"] for r in evals], [r["heldout_rmse"] for r in evals], "-o", ms=3, label="policy")
    right.axhline(evals[-1]["heldout_mean_action_rmse"], color="C1", ls="--", label="mean action")
    if evals[-1].get("heldout_hold_state_rmse") is not None:
        right.axhline(evals[-1]["heldout_hold_state_rmse"], color="C2", ls="--", label="hold state")
    right.set(xlabel="step", ylabel="RMSE (normalised)", yscale="log", title="held-out action error")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, run_folder.heldout_plot)
