"""A continuous baseline: an MLP that regresses the normalised action chunk from the state with a mean-squared error.

It is the control in ``scripts/multimodal.py``: the same data, chunk (``time_horizon``, ``n_action_steps``),
normalisation (exact quantiles of the training frames, q01/q99 -> -1/+1, as ``vla train``) and optimiser and schedule
(``VLAConfig``'s AdamW and cosine presets) as the tokenized policy, and about as many parameters
(``hidden_for``), but a squared error instead of cross-entropy over action tokens. Where the demonstrations hold
two right answers for one state, the squared error is smallest at their average, which need be neither.

    policy, losses = train_regression(root, RegressionConfig(state_dim=4, action_dim=2, hidden=512), steps=2000)
    chunks = policy.predict_action_chunk({"observation.state": states})   # [B, T, D] raw units
    policy.save_pretrained(folder); policy = RegressionPolicy.from_pretrained(folder)

It reads the state only (no camera, no instruction): on a single-task, state-only dataset that is everything the
tokenized policy's prefix holds beyond a constant sentence. Saved as ``model.safetensors`` + ``config.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import action_tokenizers as at
import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE
from safetensors.torch import load_file, save_file
from torch import nn

from vla.data import columns, reader
from vla.data.stats import frame_stats
from vla.io import atomic_directory, read_json, write_json

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class RegressionConfig:
    state_dim: int  # S
    action_dim: int  # D
    time_horizon: int = 10  # T: actions per predicted chunk
    n_action_steps: int = 5  # actions executed from each chunk before predicting the next
    hidden: int = 256  # width of every hidden layer
    layers: int = 3  # hidden layers (Linear + GELU each)

    def __post_init__(self) -> None:
        for name in ("state_dim", "action_dim", "time_horizon", "hidden", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.n_action_steps <= self.time_horizon:
            raise ValueError(
                f"n_action_steps must be in 1..time_horizon ({self.time_horizon}), got {self.n_action_steps}"
            )

    def parameters(self) -> int:
        """The MLP's parameter count, weights and biases."""
        h, out = self.hidden, self.time_horizon * self.action_dim
        return (self.state_dim + 1) * h + (self.layers - 1) * (h + 1) * h + (h + 1) * out


def hidden_for(params: int, state_dim: int, action_dim: int, time_horizon: int, layers: int = 3) -> int:
    """The hidden width whose MLP has about ``params`` parameters (the nearest, from the quadratic in the width)."""
    if layers < 2:
        raise ValueError(f"hidden_for matches widths for 2 or more hidden layers, got layers={layers}")
    out = time_horizon * action_dim
    # (L-1) h^2 + (S + 1 + (L-1) + out) h + out = params
    a, b, c = layers - 1, state_dim + 1 + (layers - 1) + out, out - params
    return max(1, round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


class RegressionPolicy(nn.Module):
    """State -> normalised action chunk ``[T, D]``, an MLP trained with MSE; normalisers kept with the weights."""

    def __init__(self, config: RegressionConfig, action_normalizer: at.Normalizer, state_normalizer: at.Normalizer):
        super().__init__()
        if (action_normalizer.dim, state_normalizer.dim) != (config.action_dim, config.state_dim):
            raise ValueError(
                f"the normalisers are for D={action_normalizer.dim}, S={state_normalizer.dim}; the config "
                f"says D={config.action_dim}, S={config.state_dim}"
            )
        self.config, self.action_normalizer, self.state_normalizer = config, action_normalizer, state_normalizer
        widths = [config.state_dim] + [config.hidden] * config.layers
        blocks: list[nn.Module] = []
        for n_in, n_out in zip(widths[:-1], widths[1:]):
            blocks += [nn.Linear(n_in, n_out), nn.GELU()]
        self.net = nn.Sequential(*blocks, nn.Linear(config.hidden, config.time_horizon * config.action_dim))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        """Normalised states ``[B, S]`` -> normalised chunks ``[B, T, D]``."""
        return self.net(state).view(len(state), self.config.time_horizon, self.config.action_dim)

    def _normalized_state(self, state: Any) -> torch.Tensor:
        state = np.asarray(state.detach().cpu() if hasattr(state, "detach") else state, dtype=np.float32)
        return torch.as_tensor(self.state_normalizer.normalize(state), dtype=torch.float32)

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean squared error in the normalised space over the chunk's real (not padded) steps."""
        target = torch.as_tensor(
            self.action_normalizer.normalize(np.asarray(batch[ACTION], np.float32)), dtype=torch.float32
        )
        pred = self(self._normalized_state(batch[OBS_STATE]))  # [B, T, D]
        keep = ~torch.as_tensor(np.asarray(batch["action_is_pad"], bool))  # [B, T]
        err = ((pred - target) ** 2).mean(-1)  # [B, T]
        loss = (err * keep).sum() / keep.sum().clamp(min=1)
        return loss, {"loss": float(loss.detach())}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any]) -> torch.Tensor:
        """Action chunks ``[B, T, D]`` in raw units for a batch of states."""
        pred = self(self._normalized_state(batch[OBS_STATE])).numpy()
        return torch.as_tensor(self.action_normalizer.unnormalize(pred), dtype=torch.float32)

    def save_pretrained(self, folder: str | Path) -> None:
        """``config.json`` (config and normalisers) and ``model.safetensors``, written atomically."""
        with atomic_directory(folder) as tmp:
            save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(tmp / WEIGHTS_FILE))
            write_json(
                tmp / CONFIG_FILE,
                {
                    "format_version": FORMAT_VERSION,
                    "config": dataclasses.asdict(self.config),
                    "action_normalizer": self.action_normalizer.to_dict(),
                    "state_normalizer": self.state_normalizer.to_dict(),
                },
            )

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> RegressionPolicy:
        folder = Path(folder)
        if not (folder / WEIGHTS_FILE).is_file():
            raise ValueError(
                f"no regression policy at {folder} (no {WEIGHTS_FILE}); pass a folder save_pretrained wrote"
            )
        saved = read_json(folder / CONFIG_FILE, "regression policy", format_version=FORMAT_VERSION)
        policy = cls(
            RegressionConfig(**saved["config"]),
            at.Normalizer.from_dict(saved["action_normalizer"]),
            at.Normalizer.from_dict(saved["state_normalizer"]),
        )
        policy.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
        return policy.eval()


def train_regression(
    root: str | Path,
    config: RegressionConfig,
    *,
    steps: int = 2000,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> tuple[RegressionPolicy, list[float]]:
    """Fit on every chunk of the dataset at ``root`` (one per frame, as ``vla train`` samples them) with ``VLAConfig``'s
    optimiser and a cosine schedule decaying over ``steps``; returns the policy (eval mode) and the loss per step."""
    from tqdm.auto import tqdm

    from vla.policy import VLAConfig

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be at least 1, got {steps} and {batch_size}")
    info = reader.dataset_info(root)
    if (info.state_dim, info.action_dim) != (config.state_dim, config.action_dim):
        raise ValueError(
            f"{root} holds S={info.state_dim}, D={info.action_dim}; the config says "
            f"S={config.state_dim}, D={config.action_dim}"
        )
    stats = frame_stats(info, [ACTION, OBS_STATE])  # exact quantiles, as vla train's normalisers
    chunks, is_pad = columns.action_chunks(info, config.time_horizon)  # [N, T, D], [N, T]
    states = columns.chunk_states(info)  # [N, S]
    torch.manual_seed(seed)
    policy = RegressionPolicy(
        config, at.Normalizer.from_stats(stats[ACTION]), at.Normalizer.from_stats(stats[OBS_STATE])
    )
    recipe = VLAConfig(scheduler_decay_steps=steps)
    optimizer = recipe.get_optimizer_preset().build(policy.parameters())
    scheduler = recipe.get_scheduler_preset().build(optimizer, steps)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    policy.train()
    bar = tqdm(range(steps), desc="train regression", disable=not progress)
    for _ in bar:
        rows = rng.integers(0, len(chunks), batch_size)
        loss, metrics = policy.loss({OBS_STATE: states[rows], ACTION: chunks[rows], "action_is_pad": is_pad[rows]})
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), recipe.optimizer_grad_clip_norm)
        optimizer.step()
        scheduler.step()
        losses.append(metrics["loss"])
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
    return policy.eval(), losses


__all__ = ["RegressionConfig", "RegressionPolicy", "hidden_for", "train_regression"]
