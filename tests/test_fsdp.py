"""configs/accelerate/fsdp.yaml, the FSDP settings for the 3B shape, checked without running FSDP (no GPU needed).

The file goes through accelerate's own launch path (``accelerate launch --config_file`` validation and the
environment it hands the processes) into a ``FullyShardedDataParallelPlugin``; its wrap classes must be the
transformer layers of the policy configs/paligemma-3b.yaml builds. That policy is built on the meta device (no memory
behind its ~3B parameters) with random weights from the preset, since its ``backbone_path`` is a local download.

scripts/gpu_check.py (the GPU check) is tested here too, as far as a CPU allows: its peak table, FLOPs and MFU
arithmetic, argument checks, ``--dry-run`` and the clear failure without CUDA. Nothing is timed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).parents[1]
FSDP_CONFIG = REPO / "configs" / "accelerate" / "fsdp.yaml"


def fsdp_plugin():
    """The plugin each process of ``accelerate launch --config_file configs/accelerate/fsdp.yaml`` builds."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin, patch_environment
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(FSDP_CONFIG), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp
    env = {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    with patch_environment(**env):
        plugin = FullyShardedDataParallelPlugin()
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    return plugin, env


def test_fsdp_config_parses_into_accelerates_plugin():
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin, env = fsdp_plugin()
    assert env["ACCELERATE_USE_FSDP"] == "true" and plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True  # FSDP2's FULL_SHARD
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.transformer_cls_names_to_wrap == ["GemmaDecoderLayer", "SiglipEncoderLayer"]
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    assert plugin.activation_checkpointing and type(plugin.cpu_offload).__name__ == "OffloadPolicy"  # no offload
    # a full state dict gathered to rank 0 on the CPU: the same safetensors files a single process writes
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert plugin.state_dict_config.rank0_only and plugin.state_dict_config.offload_to_cpu


def test_wrap_classes_are_the_3b_policys_layers(gemma_like_dir):
    """Every class named exists in transformers and in the model the 3B config builds, as many times as it has layers."""
    import action_tokenizers as at
    import transformers.models.gemma.modeling_gemma as gemma
    import transformers.models.siglip.modeling_siglip as siglip

    from vla.config import load_config
    from vla.model.presets import get_preset
    from vla.policy import VLAPolicy

    plugin, _ = fsdp_plugin()
    assert plugin.transformer_cls_names_to_wrap == ["GemmaDecoderLayer", "SiglipEncoderLayer"]
    assert gemma.GemmaDecoderLayer.__name__ == "GemmaDecoderLayer" and siglip.SiglipEncoderLayer

    cfg = load_config(str(REPO / "configs" / "paligemma-3b.yaml"))
    assert cfg.mixed_precision == "bf16" and cfg.batch_size % 8 == 0  # bf16 under FSDP; the batch splits over 8 GPUs
    horizon, dim, state_dim = cfg.policy.time_horizon, 7, 8
    chunks = np.random.default_rng(0).standard_normal((64, horizon, dim))
    config = dataclasses.replace(cfg.policy, backbone_path=None, action_dim=dim, state_dim=state_dim, device="cpu")
    with torch.device("meta"):  # the real 3B shape, nothing allocated
        policy = VLAPolicy(
            config,
            action_tokenizer=at.BinningTokenizer.fit(chunks, n_bins=256),
            action_normalizer=at.Normalizer.fit(chunks),
            state_normalizer=at.Normalizer.fit(np.zeros((4, state_dim)) + np.arange(4)[:, None]),
            text_tokenizer_dir=gemma_like_dir,
        )
    assert all(p.is_meta for p in policy.parameters())
    assert 2.8e9 < sum(p.numel() for p in policy.parameters()) < 3.1e9  # PaliGemma 3B (tied LM head counted once)

    counts = {}
    for module in policy.modules():
        counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
    preset = get_preset(cfg.policy.preset)
    assert counts.get("GemmaDecoderLayer") == preset.num_layers == 18
    assert counts.get("SiglipEncoderLayer") == preset.vision_layers == 27

    plugin.set_auto_wrap_policy(policy)  # accelerate resolves the names in the model, or raises
    wrap = plugin.auto_wrap_policy.keywords["transformer_layer_cls"]
    assert wrap == {gemma.GemmaDecoderLayer, siglip.SiglipEncoderLayer}
    # each unit is a sizeable share of the model; the root keeps the rest (embeddings tied with the LM head, projector)
    per_layer = {type(m): sum(p.numel() for p in m.parameters()) for m in policy.modules() if type(m) in wrap}
    assert 8e7 < per_layer[gemma.GemmaDecoderLayer] < 1.5e8 and 1e7 < per_layer[siglip.SiglipEncoderLayer] < 2e7


def test_a_wrong_class_name_is_refused():
    """The check above would catch a renamed layer class: accelerate refuses a name the model lacks."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch import nn

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP", transformer_cls_names_to_wrap=["GemmaDecoderLayr"]
    )
    with pytest.raises(ValueError, match="GemmaDecoderLayr"):
        plugin.set_auto_wrap_policy(nn.Sequential(nn.Linear(2, 2)))


def test_vla_train_refuses_fsdp_until_its_checkpoints_gather(monkeypatch, tmp_path):
    """Under FSDP the first checkpoint would fail hours in (sharded weights, EMA and optimiser state): refused at once."""
    import accelerate
    from accelerate.utils import DistributedType

    from vla import train
    from vla.config import TrainConfig
    from vla.policy import VLAConfig

    monkeypatch.setattr(accelerate.Accelerator, "distributed_type", property(lambda self: DistributedType.FSDP))
    cfg = TrainConfig(
        dataset_root=str(tmp_path / "none"), output_dir=str(tmp_path / "run"), policy=VLAConfig(device="cpu")
    )
    with pytest.raises(ValueError, match="cannot save FSDP-sharded runs yet"):
        train.main(cfg)
    assert not (tmp_path / "run").exists()


# --- scripts/gpu_check.py: what can be checked without a GPU ---------------------------------------------------
def gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_arithmetic_and_arguments():
    gc = gpu_check()
    assert gc.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and gc.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gc.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and gc.peak_tflops("NVIDIA L40S") == 362.0
    assert gc.peak_tflops("Some Future GPU") is None and gc.peak_tflops("Some Future GPU", 100) == 100.0
    # 6 * params * tokens per tower; 1 TFLOP per sample at 500 samples/s on a 1000 TFLOP/s GPU is 50 %
    assert gc.model_flops_per_sample(1_000, 10, 100, 4) == 6 * (1_000 * 10 + 100 * 4)
    assert gc.mfu(1e12, 500.0, 1000.0) == pytest.approx(0.5) and gc.mfu(1e12, 500.0, None) is None
    args = gc.parse_args(["--peak-tflops", "500", "--shapes", "small", "--steps", "3"])
    assert args.peak_tflops == 500 and args.shapes == ["small"] and args.steps == 3
    for bad in (["--shapes", "huge"], ["--steps", "0"], ["--peak-tflops", "-1"]):
        with pytest.raises(SystemExit):
            gc.parse_args(bad)


def test_gpu_check_counts_flops_of_a_real_policy(capsys):
    """The FLOPs per sample come from the policy's towers and its packed batch; --dry-run prints them (no GPU)."""
    gc = gpu_check()
    policy = gc.make_policy(device="meta", **gc.SHAPES["paligemma-3b"])
    row = gc.plan(policy, batch_size=2)
    decoder, vision = row["decoder_parameters"], row["vision_parameters"]
    assert 1.9e9 < decoder < 2.1e9 and 4.0e8 < vision < 4.3e8  # Gemma 2B without embeddings, SigLIP So400m
    assert row["patches_per_sample"] == 256 and row["tokens_per_sample"] > 256  # 224 px / 14 px patches + text
    assert row["flops_per_sample"] == gc.model_flops_per_sample(decoder, row["tokens_per_sample"], vision, 256)
    assert gc.main(["--dry-run", "--shapes", "small", "--batch-small", "2"]) == 0
    assert '"shape": "small"' in capsys.readouterr().out


def test_gpu_check_fails_clearly_without_cuda(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check().main(["--out", "/nonexistent/never_written.json"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    """The same measuring code on the CPU (a smoke run: one step, one chunk; the numbers themselves mean nothing)."""
    import json

    out = tmp_path / "gpu_check.json"
    assert (
        gpu_check().main(
            [
                "--device",
                "cpu",
                "--shapes",
                "small",
                "--batch-small",
                "1",
                "--warmup",
                "0",
                "--steps",
                "1",
                "--decode-presets",
                "micro",
                "--decode-reps",
                "1",
                "--decode-warmup",
                "0",
                "--peak-tflops",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    (train,) = result["train"]
    assert train["shape"] == "small" and train["samples_per_s"] > 0 and np.isfinite(train["final_loss"])
    assert train["mfu"] == pytest.approx(train["flops_per_sample"] * train["samples_per_s"] / 1e12)
    (decode,) = result["decode"]
    assert decode["preset"] == "micro" and decode["chunk_shape"][0] == 1 and decode["ms_per_chunk_p50"] > 0
