"""FSQ: a small temporal-convolution autoencoder over the chunk with a finite-scalar-quantization bottleneck.

Mentzer et al., "Finite Scalar Quantization: VQ-VAE Made Simple" (arXiv:2309.15505): bound each latent channel,
round it to ``levels[i]`` values with a straight-through gradient; a code's id is the mixed-radix number of its
rounded channels (``vector_quantize_pytorch.FSQ``).

    chunk [B, T, D] -> conv encoder, time downsampled by ``downsample`` -> latents [B, K, len(levels)]
      -> FSQ -> ids [B, K]   (K = ceil(T / downsample) tokens per chunk, vocabulary prod(levels))
    ids -> codes -> conv decoder -> chunk [B, T, D]

Round trip: lossy, learned; ``fit`` reports the reconstruction error it reaches. Every sequence of exactly K
in-range ids decodes (the decoder is total), so the only failure mode is a wrong length or an out-of-range id.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm
from vector_quantize_pytorch import FSQ

from .base import ActionTokenizer, DecodeMode, DecodeResult, as_chunk_batch, as_id_rows, check_mode, finish_decode
from .constraint import Constraint, fixed_length

WEIGHTS_FILE = "model.safetensors"
DEFAULT_LEVELS = (8, 5, 5, 5)  # 2^10 codes, the paper's recommendation and QueST/OAT's choice for actions


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

    def __init__(self, model: ChunkAutoencoder, options: dict[str, Any]):
        super().__init__()
        self.model = model.eval()
        self.options = options
        self.time_horizon = options["time_horizon"]
        self.action_dim = options["action_dim"]
        self.levels = list(options["levels"])
        self.fit_report: dict[str, float] = {}

    @classmethod
    def fit(
        cls,
        chunks: np.ndarray,
        levels: list[int] | tuple[int, ...] = DEFAULT_LEVELS,
        downsample: int = 2,
        hidden: int = 64,
        depth: int = 2,
        steps: int = 3000,
        batch_size: int = 256,
        lr: float = 2e-3,
        seed: int = 0,
        show_progress: bool = True,
    ) -> FSQTokenizer:
        """Train the autoencoder on normalised chunks ``[N, T, D]`` (seeded; AdamW, cosine decay, MSE)."""
        arr = as_chunk_batch(chunks)
        levels = [int(v) for v in levels]
        if len(levels) == 0 or min(levels) < 2:
            raise ValueError(f"levels must be a non-empty list of integers >= 2, got {levels}")
        for name, value in (("downsample", downsample), ("hidden", hidden), ("steps", steps), ("batch_size", batch_size)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if downsample > arr.shape[1]:
            raise ValueError(f"downsample {downsample} is larger than time_horizon {arr.shape[1]}; use <= {arr.shape[1]}")
        options = {
            "levels": levels, "downsample": int(downsample), "hidden": int(hidden), "depth": int(depth),
            "time_horizon": arr.shape[1], "action_dim": arr.shape[2],
        }  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _build(options)
            data = torch.as_tensor(arr, dtype=torch.float32)
            generator = torch.Generator().manual_seed(seed)
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
            warmup = max(1, steps // 20)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0)))
            )
            model.train()
            bar = tqdm(range(steps), desc="fit FSQ", disable=not show_progress, leave=False)
            for _ in bar:
                batch = data[torch.randint(len(data), (min(batch_size, len(data)),), generator=generator)]
                loss = nn.functional.mse_loss(model(batch), batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                bar.set_postfix(mse=f"{loss.item():.5f}", refresh=False)
        tok = cls(model, options)
        tok.fit_report = {"final_train_mse": float(loss.item()), "steps": steps}
        return tok

    @property
    def vocab_size(self) -> int:
        return int(np.prod(self.levels))

    @property
    def tokens_per_chunk_fixed(self) -> int:
        return self.model.tokens

    def encode(self, chunks: np.ndarray) -> list[list[int]]:
        arr = as_chunk_batch(chunks, time_horizon=self.time_horizon, action_dim=self.action_dim)
        self.encode_stats.chunks += len(arr)
        self.encode_stats.values += arr.size
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
        t, d = self._resolve_shape(time_horizon, action_dim)
        if (t, d) != (self.time_horizon, self.action_dim):
            raise ValueError(
                f"this FSQ tokenizer decodes chunks of [{self.time_horizon}, {self.action_dim}], not [{t}, {d}]"
            )
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
        self._resolve_shape(time_horizon, action_dim)
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

    @classmethod
    def _from_saved(cls, config: dict[str, Any], directory: Path) -> FSQTokenizer:
        path = directory / WEIGHTS_FILE
        if not path.is_file():
            raise ValueError(f"FSQ weights {path} are missing; save the tokenizer again")
        model = _build(config)
        try:
            model.load_state_dict(load_file(str(path)))
        except Exception as err:  # safetensors raises its own error types for truncated files
            raise ValueError(f"FSQ weights {path} are corrupt or do not match the config ({err})") from None
        return cls(model, config)


def _build(options: dict[str, Any]) -> ChunkAutoencoder:
    return ChunkAutoencoder(
        action_dim=options["action_dim"],
        time_horizon=options["time_horizon"],
        levels=options["levels"],
        hidden=options["hidden"],
        downsample=options["downsample"],
        depth=options["depth"],
    )
