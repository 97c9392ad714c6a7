"""Experiment configuration: dataclasses parsed by draccus from ``configs/*.yaml`` plus command-line overrides.

    vla train --config_path configs/debug.yaml --steps=100 --tokenizer.type=fast --tokenizer.scale=5

draccus gotcha: a field of a choice type needs its ``type`` too on the command line (``--tokenizer.type=fast``
before ``--tokenizer.scale=5``), even when the YAML already chose it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import draccus
import numpy as np

import action_tokenizers as at
from vla.sequence import STATE_ENCODINGS


# --- action tokenizers: one choice registry, one dataclass per tokenizer --------------------------------------
@dataclass
class TokenizerConfig(draccus.ChoiceRegistry):
    # Load a tokenizer saved with save_pretrained instead of fitting one (its type must match).
    pretrained_path: str | None = None

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def options(self) -> dict[str, Any]:
        raise NotImplementedError

    def build(self, chunks: np.ndarray) -> at.ActionTokenizer:
        """Load ``pretrained_path``, or fit on normalised training chunks ``[N, T, D]``."""
        if self.pretrained_path:
            tok = at.load_tokenizer(self.pretrained_path)
            if tok.name != self.type:
                raise ValueError(f"{self.pretrained_path} holds a {tok.name!r} tokenizer, the config asks for {self.type!r}")
            return tok
        return at.get_tokenizer_class(self.type).fit(chunks, **self.options())


@TokenizerConfig.register_subclass("fast")
@dataclass
class FASTConfig(TokenizerConfig):
    scale: float = 10.0  # DCT coefficients are multiplied by this before rounding: higher = finer, more tokens
    vocab_size: int = 1024  # BPE vocabulary size (must cover the coefficient range)
    byte_level: bool = False  # True: the reference's byte-level BPE (for exact reference ids)

    def options(self) -> dict[str, Any]:
        return {"scale": self.scale, "vocab_size": self.vocab_size, "byte_level": self.byte_level}


@TokenizerConfig.register_subclass("bin")
@dataclass
class BinConfig(TokenizerConfig):
    n_bins: int = 256  # uniform bins over [-1, 1] per value

    def options(self) -> dict[str, Any]:
        return {"n_bins": self.n_bins}


@TokenizerConfig.register_subclass("fsq")
@dataclass
class FSQConfig(TokenizerConfig):
    levels: list[int] = field(default_factory=lambda: [8, 5, 5, 5])  # FSQ levels per latent channel
    downsample: int = 2  # time steps per token
    hidden: int = 64  # conv channels
    depth: int = 2  # extra conv blocks on each side
    steps: int = 3000  # training steps for the autoencoder
    seed: int = 0

    def options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("levels", "downsample", "hidden", "depth", "steps", "seed")}


# --- the policy and the run -----------------------------------------------------------------------------------
@dataclass
class PolicyOptions:
    preset: str = "tiny"  # model size: tiny (CPU), small, paligemma-3b
    time_horizon: int = 10  # T: actions per chunk
    n_action_steps: int = 10  # actions executed from each chunk before predicting again (<= time_horizon)
    image_keys: list[str] = field(default_factory=list)  # cameras to use; empty = state and task only
    image_size: int | None = None  # pixels (square) fed to the vision tower; None = the preset's
    state_encoding: str = "text"  # "text" (pi0-FAST: integers in the prompt) or "embedding" (an MLP's prefix embeddings)
    temperature: float = 0.0  # 0 = greedy decoding
    constrained: bool = True  # mask logits with the tokenizer's constraint while decoding
    backbone_path: str | None = None  # a local PaliGemma checkpoint folder for the paligemma-3b preset


@dataclass
class TrainConfig:
    dataset_root: str = "outputs/datasets/metaworld_push-v3"  # a local LeRobot v3.0 dataset
    output_dir: str = "outputs/train/default"  # checkpoints, metrics.jsonl, loss.png, the final policy
    tokenizer: TokenizerConfig = field(default_factory=FASTConfig)
    policy: PolicyOptions = field(default_factory=PolicyOptions)
    heldout_episodes: float = 0.0  # share of episodes kept out of training (and out of tokenizer fitting)
    steps: int = 2000  # optimiser steps
    batch_size: int = 32  # samples per step, over all processes
    lr: float = 1e-3  # peak learning rate (after warm-up)
    warmup_steps: int = 100  # linear warm-up, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW betas (the FAST paper's)
    grad_clip: float = 1.0  # max gradient norm
    ema_decay: float = 0.999  # EMA of the weights; 0 turns it off. The final policy uses the EMA weights.
    save_every: int = 500  # checkpoint every this many steps (and at the end)
    log_every: int = 10  # steps between metrics lines
    num_workers: int = 0  # DataLoader workers
    mixed_precision: str = "auto"  # auto (bf16 on GPU, none on CPU), no, bf16, fp16
    seed: int = 0
    resume: bool = False  # continue from the last checkpoint in output_dir
    progress: bool = True  # show a progress bar

    def __post_init__(self) -> None:
        checks = [
            (self.steps >= 1, f"steps must be >= 1, got {self.steps}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (0 <= self.warmup_steps, f"warmup_steps must be >= 0, got {self.warmup_steps}"),
            (0 <= self.ema_decay < 1, f"ema_decay must be in [0, 1), got {self.ema_decay}; use 0 to turn EMA off"),
            (self.save_every >= 1, f"save_every must be >= 1, got {self.save_every}"),
            (0 <= self.heldout_episodes < 1, f"heldout_episodes is a share in [0, 1), got {self.heldout_episodes}"),
            (len(self.betas) == 2, f"betas must be two numbers, got {self.betas}"),
            (
                self.mixed_precision in ("auto", "no", "bf16", "fp16"),
                f"mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}",
            ),
            (
                self.policy.state_encoding in STATE_ENCODINGS,
                f"policy.state_encoding must be one of {', '.join(STATE_ENCODINGS)}, got {self.policy.state_encoding!r}",
            ),
            (
                1 <= self.policy.n_action_steps <= self.policy.time_horizon,
                f"policy.n_action_steps must be in [1, time_horizon={self.policy.time_horizon}], "
                f"got {self.policy.n_action_steps}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def load_config(config_path: str | None = None, args: list[str] | None = None) -> TrainConfig:
    """Parse a YAML file (a short diff against the defaults) plus ``--key=value`` overrides."""
    return draccus.parse(TrainConfig, config_path=config_path, args=args or [])
