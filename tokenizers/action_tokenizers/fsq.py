"""FSQ: a small temporal-convolution autoencoder over the chunk with a finite-scalar-quantization bottleneck.

Mentzer et al., "Finite Scalar Quantization: VQ-VAE Made Simple" (arXiv:2309.15505): bound each latent channel,
round it to ``levels[i]`` values with a straight-through gradient; a code's id is the mixed-radix number of its
rounded channels (``vector_quantize_pytorch.FSQ``).

    chunk [B, T, D] -> conv encoder, time downsampled by ``downsample`` -> latents [B, K, len(levels)]
      -> FSQ -> ids [B, K]   (K = ceil(T / downsample) tokens per chunk, vocabulary prod(levels))
    ids -> codes -> conv decoder -> chunk [B, T, D]

Round trip: lossy, learned; ``fit`` reports the reconstruction error it reaches. Every sequence of exactly K
in-range ids decodes (the decoder is total), so the only failure mode is a wrong length or an out-of-range id.
Values beyond ``+-VALUE_LIMIT`` are clipped to it before encoding and counted in ``encode_stats.clipped``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm
from vector_quantize_pytorch import FSQ

from .base import (
    CONFIG_NAME,
    MAX_VOCAB_SIZE,
    ActionTokenizer,
    DecodeMode,
    DecodeResult,
    as_chunk_batch,
    as_id_rows,
    check_mode,
    check_saved,
    check_size,
    finish_decode,
)
from .constraint import Constraint, fixed_length
from .io import read_tensors

WEIGHTS_FILE = "model.safetensors"
DEFAULT_LEVELS = (8, 5, 5, 5)  # 2^10 codes, the paper's recommendation and QueST/OAT's choice for actions
# Normalised values beyond +-this are clipped (and counted) before encoding: far outside any data the model is fitted
# on, where the encoder's bounded bottleneck is saturated, and small enough that float32 and the convolutions stay
# finite (a value of 1e39 would be inf in float32, and inf - inf makes the codes NaN).
VALUE_LIMIT = 1e4
MAX_HIDDEN = 4096  # conv channels (64 by default): 4096 is already ~50M weights per conv block
MAX_DEPTH = 64  # extra conv blocks on each side (2 by default)
MAX_THREADS = 256  # torch CPU threads while fitting (1 by default): each is a thread torch starts


class ChunkAutoencoder(nn.Module):
    """Conv1d encoder/decoder over time; channels-first inside (``[B, C, T]``)."""

    def __init__(self, action_dim: int, time_horizon: int, levels: list[int], hidden: int, downsample: int, depth: int):
        super().__init__()
        self.time_horizon = time_horizon
        self.downsample = downsample
        self.tokens = math.ceil(time_horizon / downsample)
        code_dim = len(levels)

        def block() -> nn.Sequential:
            return nn.Sequential(nn.Conv1d(hidden, hidden, 3, padding=1), nn.GELU())

        self.encoder = nn.Sequential(
            nn.Conv1d(action_dim, hidden, 3, padding=1),
            nn.GELU(),
            *[block() for _ in range(depth)],
            nn.Conv1d(hidden, hidden, downsample, stride=downsample),  # [B, H, K]
            nn.GELU(),
            nn.Conv1d(hidden, code_dim, 1),
        )
        self.fsq = FSQ(levels=list(levels), channel_first=True)
        self.decoder = nn.Sequential(
            nn.Conv1d(code_dim, hidden, 1),
            nn.GELU(),
            nn.ConvTranspose1d(hidden, hidden, downsample, stride=downsample),  # [B, H, K * downsample]
            nn.GELU(),
            *[block() for _ in range(depth)],
            nn.Conv1d(hidden, action_dim, 3, padding=1),
        )

    def _pad(self, x: torch.Tensor) -> torch.Tensor:  # [B, D, T] -> [B, D, K * downsample], edge-padded
        extra = self.tokens * self.downsample - x.shape[-1]
        return nn.functional.pad(x, (0, extra), mode="replicate") if extra else x

    def encode(self, chunks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, T, D]`` -> (quantized codes ``[B, code_dim, K]``, ids ``[B, K]``)."""
        z = self.encoder(self._pad(chunks.transpose(1, 2)))
        return self.fsq(z)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, code_dim, K]`` -> ``[B, T, D]``."""
        return self.decoder(codes)[..., : self.time_horizon].transpose(1, 2)

    def decode_ids(self, ids: torch.Tensor) -> torch.Tensor:
        codes = self.fsq.indices_to_codes(ids)  # [B, code_dim, K] (channel_first)
        return self.decode_codes(codes)

    def forward(self, chunks: torch.Tensor) -> torch.Tensor:
        codes, _ = self.encode(chunks)
        return self.decode_codes(codes)


class FSQTokenizer(ActionTokenizer):
    name: ClassVar[str] = "fsq"

    @dataclass(frozen=True)
    class Options:
        """``fit``'s options: ``FSQTokenizer.fit(chunks, **asdict(FSQTokenizer.Options()))`` is ``fit(chunks)``."""

        levels: tuple[int, ...] = field(
            default=DEFAULT_LEVELS, metadata={"help": "FSQ levels per latent channel: the vocabulary is their product"}
        )
        downsample: int = field(
            default=2, metadata={"help": "time steps per token: ceil(T / downsample) ids per chunk"}
        )
        hidden: int = field(default=64, metadata={"help": "channels of the conv encoder and decoder"})
        depth: int = field(default=2, metadata={"help": "extra conv blocks on each side"})
        steps: int = field(
            default=3000, metadata={"help": "most training steps; fewer when the held-out error stops improving"}
        )
        batch_size: int = field(default=256, metadata={"help": "chunks per training step"})
        lr: float = field(
            default=2e-3, metadata={"help": "peak AdamW learning rate (linear warm-up, then cosine decay)"}
        )
        patience: int = field(
            default=4,
            metadata={
                "help": "stop after this many checks (every 100 steps) without 2% better held-out error; 0: never"
            },
        )
        max_seconds: float | None = field(
            default=None,
            metadata={
                "help": "stop fitting after this many seconds (the best weights so far are kept); None: no "
                "limit. On [30, 26] chunks a step takes ~0.13 s on one busy core"
            },
        )
        threads: int = field(
            default=1,
            metadata={
                "help": "torch CPU threads while fitting (the model is small: on busy cores 1 beats 2 by 4x);"
                " 0: keep torch's"
            },
        )
        seed: int = field(default=0, metadata={"help": "seed of the initialisation, batches and held-out split"})
        show_progress: bool = field(default=True, metadata={"help": "show a progress bar while fitting"})

    def __init__(self, model: ChunkAutoencoder, options: dict[str, Any]):
        super().__init__()
        self.model = model.eval()
        self.options = options
        self.time_horizon = options["time_horizon"]
        self.action_dim = options["action_dim"]
        self.levels = list(options["levels"])
        self.fit_report: dict[str, float] = {}  # what fit did: steps run, stopping reason, errors

    @classmethod
    def fit(cls, chunks: np.ndarray, **options: Any) -> FSQTokenizer:
        """Train the autoencoder on normalised chunks ``[N, T, D]`` (seeded; AdamW, warm-up + cosine, MSE;
        ``options``: ``FSQTokenizer.Options``).

        Every ``EVAL_EVERY`` steps the error on a held-out tenth of the chunks is measured; training stops once it
        has not improved by ``MIN_GAIN`` (relative) for ``patience`` checks, or once ``max_seconds`` have passed,
        and the best weights are kept. ``fit_report`` says how many steps ran, why it stopped ("steps", "plateau"
        or "time"), the seconds it took and the errors reached.
        """
        o = cls.fit_options(options)
        levels, downsample, hidden, depth, steps = o.levels, o.downsample, o.hidden, o.depth, o.steps
        batch_size, lr, patience, max_seconds, threads, seed = (
            o.batch_size,
            o.lr,
            o.patience,
            o.max_seconds,
            o.threads,
            o.seed,
        )
        show_progress = o.show_progress
        arr = as_chunk_batch(chunks)
        for label, value in (
            ("downsample", downsample),
            ("hidden", hidden),
            ("steps", steps),
            ("batch_size", batch_size),
        ):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if not isinstance(depth, (int, np.integer)) or depth < 0:
            raise ValueError(f"depth must be an integer >= 0, got {depth!r}")
        levels = check_sizes(levels, hidden, depth)
        if not isinstance(threads, (int, np.integer)) or threads < 0:
            raise ValueError(f"threads must be an integer >= 0 (0: keep torch's setting), got {threads!r}")
        check_size("threads", threads, 0, MAX_THREADS, "MAX_THREADS")
        if not isinstance(patience, (int, np.integer)) or patience < 0:
            raise ValueError(f"patience must be an integer >= 0 (0: never stop early), got {patience!r}")
        if max_seconds is not None and not (isinstance(max_seconds, (int, float)) and max_seconds > 0):
            raise ValueError(
                f"max_seconds must be a positive number of seconds or None (no limit), got {max_seconds!r}"
            )
        if downsample > arr.shape[1]:
            raise ValueError(
                f"downsample {downsample} is larger than time_horizon {arr.shape[1]}; use <= {arr.shape[1]}"
            )
        options = {
            "levels": levels,
            "downsample": int(downsample),
            "hidden": int(hidden),
            "depth": int(depth),
            "time_horizon": arr.shape[1],
            "action_dim": arr.shape[2],
        }
        before = torch.get_num_threads()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.set_num_threads(threads or before)
                torch.manual_seed(seed)
                model = _build(options)
                data = torch.as_tensor(arr, dtype=torch.float32)
                report = _train(model, data, steps, batch_size, lr, patience, max_seconds, seed, show_progress)
        finally:
            torch.set_num_threads(before)
        tok = cls(model, options)
        tok.fit_report = report
        return tok

    @property
    def vocab_size(self) -> int:
        return int(np.prod(self.levels))

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        arr = as_chunk_batch(chunks, time_horizon=self.time_horizon, action_dim=self.action_dim)
        self.encode_stats.chunks += len(arr)
        self.encode_stats.values += arr.size
        outside = int(np.count_nonzero(np.abs(arr) > VALUE_LIMIT))
        if outside:  # clipped before the float32 cast, which would make them inf (and the codes NaN)
            self.encode_stats.clipped += outside
            arr = np.clip(arr, -VALUE_LIMIT, VALUE_LIMIT)
        out = []
        with torch.inference_mode():
            for start in range(0, len(arr), 4096):
                batch = torch.as_tensor(arr[start : start + 4096], dtype=torch.float32)
                out.append(self.model.encode(batch)[1].to(torch.int64).numpy())
        return np.concatenate(out).tolist()

    def decode(
        self, ids, time_horizon: int | None = None, action_dim: int | None = None, mode: DecodeMode = "mark"
    ) -> DecodeResult:
        check_mode(mode)
        t, d = self._fitted_shape(time_horizon, action_dim)
        rows = as_id_rows(ids)
        k = self.model.tokens
        grid = np.full((len(rows), k), self._zero_id, dtype=np.int64)  # repair pads with the zero code
        valid = np.ones(len(rows), dtype=bool)
        errors: list[str | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            bad = (row < 0) | (row >= self.vocab_size)
            if bad.any():
                valid[i], errors[i] = False, f"id {int(row[bad][0])} is outside [0, {self.vocab_size})"
                row = row[~bad]
            if valid[i] and len(row) != k:
                valid[i], errors[i] = False, f"{len(row)} ids, expected {k} per chunk"
            grid[i, : min(len(row), k)] = row[:k]
        with torch.inference_mode():
            actions = self.model.decode_ids(torch.as_tensor(grid)).double().numpy()
        return finish_decode(actions, valid, errors, mode)

    @property
    def _zero_id(self) -> int:
        with torch.inference_mode():
            return int(self.model.fsq(torch.zeros(1, len(self.levels), 1))[1].item())

    def constraint(self, time_horizon: int | None = None, action_dim: int | None = None) -> Constraint:
        self._fitted_shape(time_horizon, action_dim)
        return fixed_length(self.vocab_size, self.model.tokens)

    def codes_roundtrip_ok(self, ids: np.ndarray) -> bool:
        """FSQ's invariant: ids -> codes -> ids is the identity."""
        ids_t = torch.as_tensor(np.asarray(ids))
        codes = self.model.fsq.indices_to_codes(ids_t)  # [B, code_dim, K]: channel-first like the model
        return bool(torch.equal(self.model.fsq.codes_to_indices(codes.transpose(1, 2)).long(), ids_t.long()))

    def _config(self) -> dict[str, Any]:
        return dict(self.options)

    def _save_files(self, directory: Path) -> None:
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, str(directory / WEIGHTS_FILE))

    SAVED_FIELDS: ClassVar[dict[str, str]] = {
        "levels": "ints>=2",
        "downsample": "int>=1",
        "hidden": "int>=1",
        "depth": "int>=0",
        "time_horizon": "int>=1",
        "action_dim": "int>=1",
    }

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> FSQTokenizer:
        config = check_saved(config, directory / CONFIG_NAME, cls.SAVED_FIELDS)
        try:
            check_sizes(config["levels"], config["hidden"], config["depth"])
            if config["downsample"] > config["time_horizon"]:
                t = config["time_horizon"]
                raise ValueError(f"downsample {config['downsample']} is larger than time_horizon {t}")
        except ValueError as err:
            raise ValueError(f"{directory / CONFIG_NAME}: {err}; a tokenizer never saves that: save it again") from None
        path = directory / WEIGHTS_FILE
        if not path.is_file():
            raise ValueError(f"FSQ weights {path} are missing; save the tokenizer again")
        model = _build(config)
        # checked: floats where the model holds floats (int8 weights would be cast silently), finite values
        state = read_tensors(path, model.state_dict(), "save the tokenizer again")
        try:
            model.load_state_dict(state)
        except Exception as err:  # shapes or keys that do not match the config
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ValueError(
                f"FSQ weights {path} are corrupt or do not match {directory / CONFIG_NAME} ({reason}); "
                "save the tokenizer again"
            ) from None
        return cls(model, config)


def check_sizes(levels: Any, hidden: Any, depth: Any) -> list[int]:
    """The sizes the autoencoder is built from, within their bounds (fit and load alike); ``levels`` as ints."""
    if not isinstance(levels, (list, tuple)) or not levels or not all(_int(v) and v >= 2 for v in levels):
        raise ValueError(f"levels must be a non-empty list of integers >= 2, got {levels!r}")
    levels = [int(v) for v in levels]
    vocab = math.prod(levels)
    if vocab > MAX_VOCAB_SIZE:
        raise ValueError(
            f"levels {levels} make {vocab} codes, above the bound {MAX_VOCAB_SIZE} (MAX_VOCAB_SIZE); use fewer or "
            f"smaller levels (the default {list(DEFAULT_LEVELS)} makes 1000)"
        )
    check_size("hidden", hidden, 1, MAX_HIDDEN, "MAX_HIDDEN")
    check_size("depth", depth, 0, MAX_DEPTH, "MAX_DEPTH")
    return levels


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


EVAL_EVERY = 100  # steps between held-out checks
MIN_GAIN = 0.02  # a check counts as progress when the held-out MSE falls by at least this fraction


def _train(
    model: ChunkAutoencoder,
    data: torch.Tensor,
    steps: int,
    batch_size: int,
    lr: float,
    patience: int,
    max_seconds: float | None,
    seed: int,
    show_progress: bool,
) -> dict[str, Any]:
    """AdamW on MSE with torch's linear warm-up then cosine decay; early stop on a held-out tenth (seeded) or on
    the time budget (checked every step; the held-out error is then measured once more)."""
    began = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=generator)
    n_val = min(len(data) // 10, 2048) if patience and len(data) >= 20 else 0
    val, train = data[order[:n_val]], data[order[n_val:]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warmup, total_iters=warmup),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps - warmup)),
        ],
        milestones=[warmup],
    )
    best, best_state, since_best, stopped = float("inf"), None, 0, "steps"
    model.train()
    bar = tqdm(range(steps), desc="fit FSQ", disable=not show_progress, leave=False)
    for step in bar:
        batch = train[torch.randint(len(train), (min(batch_size, len(train)),), generator=generator)]
        loss = nn.functional.mse_loss(model(batch), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if n_val and (step + 1) % EVAL_EVERY == 0:
            model.eval()
            with torch.inference_mode():
                val_mse = float(nn.functional.mse_loss(model(val), val))
            model.train()
            bar.set_postfix(train_mse=f"{loss.item():.5f}", heldout_mse=f"{val_mse:.5f}", refresh=False)
            if val_mse < best * (1 - MIN_GAIN):
                since_best = 0
            else:
                since_best += 1
            if val_mse < best:
                best, best_state = val_mse, {k: v.detach().clone() for k, v in model.state_dict().items()}
            if since_best >= patience:
                stopped = "plateau"
                break
        if max_seconds is not None and time.perf_counter() - began > max_seconds:
            stopped = "time"
            if n_val:
                model.eval()
                with torch.inference_mode():
                    val_mse = float(nn.functional.mse_loss(model(val), val))
                model.train()
                if val_mse < best:
                    best, best_state = val_mse, None  # the current weights are the best: keep them
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return {
        "steps": step + 1,
        "stopped": stopped,
        "seconds": time.perf_counter() - began,
        "final_train_mse": float(loss.item()),
        "heldout_mse": best,
    }


def _build(options: dict[str, Any]) -> ChunkAutoencoder:
    return ChunkAutoencoder(
        action_dim=options["action_dim"],
        time_horizon=options["time_horizon"],
        levels=options["levels"],
        hidden=options["hidden"],
        downsample=options["downsample"],
        depth=options["depth"],
    )
