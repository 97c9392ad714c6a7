#!/usr/bin/env python
"""The GPU check: bf16 training throughput and MFU, and decode latency, on one CUDA GPU in under 5 minutes.

    scripts/gpu_check.sh                                   # = python scripts/gpu_check.py --out results/gpu_check.json
    python scripts/gpu_check.py --peak-tflops 989 ...      # a GPU the peak table lacks (dense bf16 TFLOP/s)
    python scripts/gpu_check.py --dry-run                  # no GPU: the plan, parameter counts and FLOPs per sample

Training (random weights, no download): the ``small`` policy (one 96 px camera) and the PaliGemma 3B shape (Gemma 2B
+ SigLIP So400m/14, one 224 px camera, the state as text, as configs/paligemma-3b.yaml; with the compact action
vocabulary instead of the 257k text vocabulary, which would need PaliGemma's tokenizer), fp32 master weights under
bf16 autocast, AdamW, synthetic smooth chunks tokenised by FAST; samples/s over timed steps after warm-up ones.

MFU (model FLOPs utilisation) = model FLOPs per second / the GPU's peak dense bf16 FLOPs. Model FLOPs per sample are
the usual 6 * parameters * tokens (forward 2, backward 4), counted per tower: the Gemma decoder's parameters (the
embedding matrix excluded: a lookup, not a matmul) times the tokens it reads (image + text + action, padding
excluded), plus SigLIP's parameters times its patches. Attention's own FLOPs are left out (at ~300 tokens they are
a few per cent), so this MFU is slightly conservative. The peak comes from the device name (``PEAK_BF16_TFLOPS``)
or ``--peak-tflops``.

Decode: ms per chunk of ``predict_action_chunk`` (the policy's own path: prefill, KV-cached constrained decoding,
detokenising) for ``tiny`` and ``small``, batch 1, median of ``--decode-reps`` after warm-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets, matched against
# torch.cuda.get_device_name() in this order (the first substring that appears wins).
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 6000 Ada", 364.0),
]

# Each measured policy: preset, cameras and the VLAConfig fields that differ from the defaults.
SHAPES: dict[str, dict] = {
    "small": dict(preset="small", image_keys=["observation.images.top"]),
    "paligemma-3b": dict(
        preset="paligemma-3b",
        image_keys=["observation.images.top"],
        image_size=224,
        state_encoding="text",
        time_horizon=10,
        n_action_steps=10,
    ),
}
DECODE_PRESETS = ("tiny", "small")
STATE_DIM, ACTION_DIM, TIME_HORIZON = 8, 7, 10


def peak_tflops(device_name: str, override: float | None = None) -> float | None:
    """Dense bf16 peak of ``device_name`` in TFLOP/s; ``override`` wins; None when the table lacks the device."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"--peak-tflops must be positive, got {override}")
        return float(override)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key.lower() in device_name.lower()), None)


def model_flops_per_sample(
    decoder_params: int, decoder_tokens: float, vision_params: int, vision_tokens: float
) -> float:
    """Training FLOPs of one sample: 6 * parameters * tokens, per tower (see the module docstring)."""
    return 6.0 * (decoder_params * decoder_tokens + vision_params * vision_tokens)


def mfu(flops_per_sample: float, samples_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1] (``peak`` in TFLOP/s); None without a peak."""
    return None if peak is None else flops_per_sample * samples_per_s / (peak * 1e12)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/gpu_check.json", help="where the results go (JSON)")
    p.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak of this GPU; default: from its name"
    )
    p.add_argument("--shapes", default="small,paligemma-3b", help=f"training shapes, of {', '.join(SHAPES)}")
    p.add_argument("--batch-small", type=int, default=64, help="training batch of the small policy")
    p.add_argument("--batch-3b", type=int, default=8, help="training batch of the 3B shape (per GPU)")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps first")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    p.add_argument("--decode-reps", type=int, default=30, help="timed chunks per decode preset")
    p.add_argument("--decode-warmup", type=int, default=5, help="untimed chunks first")
    p.add_argument("--decode-presets", default=",".join(DECODE_PRESETS), help="presets whose decoding is timed")
    p.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: a smoke run of the same code (the tests' check; its numbers mean nothing)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="no GPU: print the plan and the FLOPs per sample, write nothing"
    )
    args = p.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown --shapes {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    for name in ("batch_small", "batch_3b", "steps", "decode_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup", "decode_warmup"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    args.decode_presets = [d for d in args.decode_presets.split(",") if d]
    from vla.model.presets import PRESETS

    unknown = [d for d in args.decode_presets if d not in PRESETS]
    if unknown:
        p.error(f"unknown --decode-presets {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        p.error(
            f"--peak-tflops must be positive (dense bf16 TFLOP/s, e.g. 989 for an H100 SXM), got {args.peak_tflops}"
        )
    args.shapes = shapes
    return args


# --- building policies and batches -----------------------------------------------------------------------------
def raw_batch(b: int, image_keys: list[str], image_size: int, seed: int = 0) -> dict:
    """A LeRobot-style batch of ``b`` synthetic samples (smooth chunks, random state and images)."""
    import torch
    from action_tokenizers.synthetic import smooth_chunks

    g = torch.Generator().manual_seed(seed)
    batch = {
        "observation.state": torch.randn(b, STATE_DIM, generator=g),
        "task": ["push the puck to the goal"] * b,
        "action": torch.as_tensor(smooth_chunks(b, TIME_HORIZON, ACTION_DIM, seed=seed), dtype=torch.float32),
        "action_is_pad": torch.zeros(b, TIME_HORIZON, dtype=torch.bool),
    }
    for key in image_keys:
        batch[key] = torch.rand(b, 3, image_size, image_size, generator=g)
    return batch


def make_policy(preset: str, image_keys: list[str], device: str = "cpu", **fields):
    """A policy of ``preset`` with random weights, a FAST tokenizer fitted on synthetic chunks, built on ``device``."""
    import action_tokenizers as at
    import torch
    from action_tokenizers.synthetic import smooth_chunks

    from vla.model.text import prompt_words
    from vla.policy import VLAConfig, VLAPolicy

    chunks = smooth_chunks(400, TIME_HORIZON, ACTION_DIM, seed=1)
    states = np.random.default_rng(0).standard_normal((400, STATE_DIM))
    options = dict(
        preset=preset,
        image_keys=list(image_keys),
        time_horizon=TIME_HORIZON,
        n_action_steps=5,
        init_seed=0,
        text_words=prompt_words(["push the puck to the goal"]),
        device="cuda" if device == "cuda" else "cpu",
    )
    config = VLAConfig(**options | fields)
    tokenizer = at.FASTTokenizer.fit(chunks, vocab_size=1024)
    with torch.device(device):  # random init on the GPU: seconds for 3B parameters, not a minute on the CPU
        policy = VLAPolicy(
            config,
            action_tokenizer=tokenizer,
            action_normalizer=at.Normalizer.fit(chunks),
            state_normalizer=at.Normalizer.fit(states),
        )
    return policy.to(device)


def tower_params(policy) -> tuple[int, int]:
    """(decoder parameters without the embedding matrix, vision tower parameters)."""
    backbone = policy.model.backbone
    vision = sum(p.numel() for p in backbone.model.vision_tower.parameters())
    embedding = backbone.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in policy.parameters())  # a tied LM head is counted once
    return total - vision - embedding, vision


def plan(policy, batch_size: int) -> dict:
    """Parameters, tokens and FLOPs per sample of one training batch of ``policy``."""
    from vla.policy.pipeline import packed, run

    cams = list(policy.config.image_keys)
    seq = packed(run(policy.pipeline.training, raw_batch(batch_size, cams, policy.model.image_size)))["sequence"]
    decoder, vision = tower_params(policy)
    tokens = float(seq.valid.sum()) / batch_size
    patches = float(policy.model.image_tokens * len(cams))
    return {
        "parameters": sum(p.numel() for p in policy.parameters()),
        "decoder_parameters": decoder,
        "vision_parameters": vision,
        "tokens_per_sample": tokens,
        "patches_per_sample": patches,
        "flops_per_sample": model_flops_per_sample(decoder, tokens, vision, patches),
    }


# --- measurements --------------------------------------------------------------------------------------------------
def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def train_throughput(name: str, batch_size: int, args, peak: float | None) -> dict:
    import torch

    from vla.policy.pipeline import packed, run

    device = args.device
    torch.manual_seed(0)
    policy = make_policy(device=device, **SHAPES[name])
    policy.train()
    row = {"shape": name, "batch_size": batch_size, **plan(policy, batch_size)}
    raw = raw_batch(batch_size, list(policy.config.image_keys), policy.model.image_size)
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in packed(run(policy.pipeline.training, raw)).items()}
    optimizer = policy.config.get_optimizer_preset().build([p for p in policy.parameters() if p.requires_grad])

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss, _ = policy(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), policy.config.optimizer_grad_clip_norm)
        optimizer.step()
        return loss.detach()

    for _ in range(args.warmup):
        step()
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    sps = batch_size * args.steps / seconds
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    row |= {
        "samples_per_s": sps,
        "step_ms": 1000 * seconds / args.steps,
        "final_loss": float(loss),
        "peak_memory_gib": memory,
        "mfu": mfu(row["flops_per_sample"], sps, peak),
    }
    policy = optimizer = batch = None  # freed before the next shape (the closure above held them)
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def decode_latency(preset: str, args) -> dict:
    """ms per chunk of ``predict_action_chunk`` at batch 1; the observation arrives on the CPU, as from a robot."""
    import torch

    cams = ["observation.images.top"]
    policy = make_policy(preset, cams, device=args.device).eval()
    obs = {k: v for k, v in raw_batch(1, cams, policy.model.image_size).items() if k not in ("action", "action_is_pad")}
    times = []
    with torch.autocast(args.device, dtype=torch.bfloat16):
        for i in range(args.decode_warmup + args.decode_reps):
            synchronize(args.device)
            start = time.perf_counter()
            chunk = policy.predict_action_chunk(obs)
            synchronize(args.device)
            if i >= args.decode_warmup:  # after the warm-up: kernels chosen and cached
                times.append(1000 * (time.perf_counter() - start))
    return {
        "preset": preset,
        "batch_size": 1,
        "ms_per_chunk_p50": float(np.median(times)),
        "ms_per_chunk_p90": float(np.percentile(times, 90)),
        "chunk_shape": list(chunk.shape),
        "decode_stats": policy.decode_stats.as_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.dry_run:
        for name in args.shapes:
            policy = make_policy(device="meta", **SHAPES[name])  # shapes only: nothing allocated
            batch = args.batch_small if name == "small" else args.batch_3b
            print(json.dumps({"shape": name, "batch_size": batch, **plan(policy, batch)}))
        peak = peak_tflops("NVIDIA H100 80GB HBM3", args.peak_tflops)
        print(f"would write {args.out}; MFU against {peak} TFLOP/s on an H100 (the device's name decides on a GPU)")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: error: no CUDA GPU is visible (torch.cuda.is_available() is False); run it on a machine "
            "with an NVIDIA GPU and a CUDA build of torch, or use --dry-run to check the plan here",
            file=sys.stderr,
        )
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({platform.processor() or 'unknown'})"
    peak = peak_tflops(name, args.peak_tflops)
    if peak is None:
        print(
            f"gpu_check: the peak table lacks {name!r}: MFU is left out; pass --peak-tflops (dense bf16)",
            file=sys.stderr,
        )
    started = time.perf_counter()
    train = []
    for shape in args.shapes:
        batch = args.batch_small if shape == "small" else args.batch_3b
        train.append(train_throughput(shape, batch, args, peak))
        print(json.dumps(train[-1]), flush=True)
    decode = [decode_latency(preset, args) for preset in args.decode_presets]
    for row in decode:
        print(json.dumps(row), flush=True)
    out = {
        "device": name,
        "peak_bf16_tflops": peak,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "decode_warmup": args.decode_warmup,
        "decode_reps": args.decode_reps,
        "train": train,
        "decode": decode,
        "seconds": time.perf_counter() - started,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    from vla.io import write_json

    write_json(path, out)
    print(f"wrote {path} in {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
