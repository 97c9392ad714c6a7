"""Where a closed-loop cell's time goes: training steps (per recipe) and evaluation episodes, each stage's share of
the wall time, from timers put around the functions that make each stage.

    python scripts/profile_cell.py [--recipes fast,images,aloha] [--steps 60] [--episodes 10] [--out results/profile]

Training: ``vla train`` (``configs/<recipe>.yaml``, batch 32, no held-out episodes, ``--num_workers=0``, one torch
thread) on ``scripts/bench_train.py``'s small datasets, ``--steps`` steps, in this process. Evaluation: the policy
that training saved, in its simulator for ``--episodes`` episodes, 10 at a time (as ``vla eval``); an untrained-ish
policy's episodes run to the step limit, so per-step shares are what to read. Each stage is the wall time spent inside
its functions (outermost calls only: a recursive or nested call is not counted twice); stages nest where the code
nests (the prefill and the decoding loop are inside the policy's call), so they are not meant to sum to 100%. On the
CPU torch runs synchronously, so a function's wall time is its work. Writes ``profile.json`` and ``README.md``.

Arithmetic: a second short run of each recipe counts the floating-point operations of its forward and backward
passes (``torch.utils.flop_counter``: matrix products, attention, convolutions), so the forward + backward seconds of
the timed run give the rate the model's own arithmetic ran at; beside it, the rate of one float32 matrix product of
the model's own largest shape (its MLP's, for the tokens of a batch) and of a large one, on the same thread. A step
whose rate is near the matrix product's is bound by its arithmetic: only less arithmetic makes it faster.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_train import RECIPES, ensure_datasets  # noqa: E402  (the datasets the training benchmark records)

# stage -> the functions (module, attribute path) whose wall time makes it
TRAIN_STAGES = {
    "batches (loading, tokenising, packing)": [("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__")],
    "forward (loss)": [("vla.policy.modeling_vla", "VLAPolicy.forward")],
    "backward": [("accelerate", "Accelerator.backward")],
    "gradient clipping": [("accelerate", "Accelerator.clip_grad_norm_")],
    "optimizer step": [("torch.optim", "AdamW.step")],
    "EMA update": [("torch", "Tensor.lerp_")],
    "policy built (normalisers, tokenizer fit)": [("vla.train", "build_policy")],
    "checkpoints and the final save": [
        ("vla.train", "save_checkpoint"),
        ("vla.policy.modeling_vla", "VLAPolicy.save_pretrained"),
    ],
}
EVAL_STAGES = {
    "simulator steps": [("vla.sim.metaworld_env", "MetaWorldEnv.step"), ("vla.sim.aloha_env", "AlohaEnv.step")],
    "  rendering the cameras (inside the steps)": [
        ("vla.sim.metaworld_env", "MetaWorldEnv.render"),
        ("vla.sim.aloha_env", "AlohaEnv.render"),
    ],
    "resets": [("vla.sim.metaworld_env", "MetaWorldEnv.reset"), ("vla.sim.aloha_env", "AlohaEnv.reset")],
    "the policy's calls (batches of observations)": [("vla.evaluate", "ChunkPolicy.predict")],
    "  prefill": [("vla.model.lean", "LeanSteps.prefill")],
    "  decoding loop (prefill included)": [("vla.model.decode", "_decode"), ("vla.model.decode", "_decode_parallel")],
    "  actions from ids (tokenizer decode)": [
        ("action_tokenizers.fast", "FASTTokenizer.decode"),
        ("action_tokenizers.binning", "BinningTokenizer.decode"),
        ("action_tokenizers.beast", "BEASTTokenizer.decode"),
    ],
}


@contextmanager
def wrapped(targets: list[tuple[str, str]], around):
    """Each function of ``targets`` (module, attribute path) that this code has replaced by ``around(original)`` while
    the block runs, and put back after; a target not in this code (a back-end or simulator the recipe does not use)
    is passed over."""
    undo = []
    for module, path in targets:
        try:
            owner = importlib.import_module(module)
            *parents, attr = path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            original = getattr(owner, attr)
        except (ImportError, AttributeError):
            continue
        setattr(owner, attr, functools.update_wrapper(around(original), original))
        undo.append((owner, attr, original))
    try:
        yield
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


@contextmanager
def timed(stages: dict[str, list[tuple[str, str]]]):
    """Wall seconds per stage while the block runs (``totals`` filled in as it goes; a nested or recursive call of a
    stage is not counted twice)."""
    totals = {name: 0.0 for name in stages}
    depth = {name: 0 for name in stages}

    def stage(name: str):
        def around(original):
            def wrapper(*args, **kwargs):
                depth[name] += 1
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    depth[name] -= 1
                    if depth[name] == 0:
                        totals[name] += time.perf_counter() - start

            return wrapper

        return around

    with contextlib.ExitStack() as stack:
        for name, targets in stages.items():
            stack.enter_context(wrapped(targets, stage(name)))
        yield totals


def measured(fn, stages):
    with timed(stages) as totals:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    return result, wall, dict(totals)


@contextmanager
def counted_flops(targets: list[tuple[str, str]]):
    """Floating-point operations inside the calls of ``targets`` while the block runs (``total`` filled in as it
    goes), each call counted by its own ``FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    total = {"flops": 0}

    def around(original):
        def wrapper(*args, **kwargs):
            counter = FlopCounterMode(display=False)
            with counter:
                result = original(*args, **kwargs)
            total["flops"] += counter.get_total_flops()
            return result

        return wrapper

    with wrapped(targets, around):
        yield total


def matmul_rate(rows: int, inner: int, cols: int, seconds: float = 1.0) -> float:
    """GFLOP/s of float32 ``[rows, inner] @ [inner, cols]`` on this thread, repeated for ``seconds``."""
    import torch

    a, b = torch.randn(rows, inner), torch.randn(inner, cols)
    a @ b  # warm-up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return 2 * rows * inner * cols * calls / (time.perf_counter() - start) / 1e9


def recipe_config(recipe: str, dataset: Path, steps: int, out: Path):
    from vla.config import load_config

    config = RECIPES[recipe][0]
    return load_config(
        str(ROOT / "configs" / f"{config}.yaml"),
        [
            f"--dataset_root={dataset}",
            f"--output_dir={out}",
            f"--steps={steps}",
            f"--save_every={steps}",
            "--log_every=10",
            "--heldout_episodes=0",
            "--num_workers=0",
            "--progress=false",
            "--batch_size=32",
        ],
    )


def arithmetic(recipe: str, dataset: Path, out: Path, steps: int = 4) -> dict:
    """The forward and backward passes' operations per training step (a ``steps``-step run), the tokens a batch
    carries, and the matrix-product rates to hold them against."""
    from vla import train
    from vla.model.presets import get_preset

    cfg = recipe_config(recipe, dataset, steps, out / f"{recipe}-flops")
    with counted_flops(TRAIN_STAGES["forward (loss)"] + TRAIN_STAGES["backward"]) as total:
        train.main(cfg)
    preset = get_preset(cfg.policy.preset)
    tokens = 32 * 64  # 32 rows of 64 tokens: the shape the product's rate is taken at, not the batch's own
    return {
        "gflop_per_step": total["flops"] / steps / 1e9,
        "matmul_gflops_model_shape": matmul_rate(tokens, preset.hidden_size, preset.intermediate_size),
        "matmul_gflops_large": matmul_rate(1024, 1024, 1024),
        "matrix_shape": [tokens, preset.hidden_size, preset.intermediate_size],
    }


def profile_recipe(recipe: str, dataset: Path, steps: int, episodes: int, out: Path) -> dict:
    from vla import evaluate, train

    cfg = recipe_config(recipe, dataset, steps, out / recipe)
    summary, wall, stages = measured(lambda: train.main(cfg), TRAIN_STAGES)
    training = {"wall_s": wall, "steps": steps, "samples_per_s": summary["samples_per_s"], "stages_s": stages}
    flops = arithmetic(recipe, dataset, out)
    compute_s = stages["forward (loss)"] + stages["backward"]
    training["arithmetic"] = flops | {"gflops_forward_backward": flops["gflop_per_step"] * steps / compute_s}
    env = "aloha/transfer-cube" if recipe == "aloha" else "metaworld/push-v3"
    report, wall, stages = measured(
        lambda: evaluate.evaluate(summary["policy_path"], env, episodes, num_envs=10, progress=False), EVAL_STAGES
    )
    evaluation = {
        "wall_s": wall,
        "episodes": episodes,
        "steps": int(sum(report["lengths"])),
        "chunks": report["chunks"],
        "stages_s": stages,
    }
    return {"train": training, "eval": evaluation}


def markdown(record: dict) -> str:
    lines = [
        "# Where a closed-loop cell's time goes (`scripts/profile_cell.py`)",
        "",
        f"One torch thread; wall time inside each stage's functions (stages nest as the code does). "
        f"Load average {record['load_average']} (shares hold better than seconds on a loaded machine).",
        "",
    ]
    for recipe, parts in record["recipes"].items():
        t, e = parts["train"], parts["eval"]
        lines += [
            f"## {recipe}",
            "",
            f"Training: {t['steps']} steps of batch 32 in {t['wall_s']:.1f} s ({t['samples_per_s']:.0f} samples/s "
            f"in the loop). Evaluation: {e['episodes']} episodes, {e['steps']} simulator steps, "
            f"{e['chunks']} chunks in {e['wall_s']:.1f} s.",
            "",
        ]
        if "arithmetic" in t:
            a = t["arithmetic"]
            lines += [
                f"Arithmetic: {a['gflop_per_step']:.2f} GFLOP a training step (forward and backward), run at "
                f"{a['gflops_forward_backward']:.1f} GFLOP/s; one float32 matrix product "
                f"{' x '.join(map(str, a['matrix_shape']))} runs at {a['matmul_gflops_model_shape']:.1f} GFLOP/s on "
                f"the same thread, 1024 x 1024 x 1024 at {a['matmul_gflops_large']:.1f}.",
                "",
            ]
        lines += [
            "| part | stage | seconds | share |",
            "| --- | --- | --- | --- |",
        ]
        for part, p in (("train", t), ("eval", e)):
            for stage, s in p["stages_s"].items():
                lines.append(f"| {part} | {stage} | {s:.2f} | {s / p['wall_s']:.0%} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default="fast,images,aloha")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/profile"))
    parser.add_argument("--allow-loaded", action="store_true", help="write to --out even when the machine was loaded")
    args = parser.parse_args()
    import torch

    from vla.io import atomic_write_text
    from vla.provenance import headline_path, provenance, quiet_machine

    torch.set_num_threads(1)
    recipes = args.recipes.split(",")
    roots = ensure_datasets(recipes)
    record = {"recipes": {}, "load_average": None}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in recipes:
            record["recipes"][recipe] = profile_recipe(recipe, roots[recipe], args.steps, args.episodes, Path(tmp))
            print(recipe, json.dumps(record["recipes"][recipe], indent=1))
    end = os.getloadavg()[0]
    record["load_average"] = round((load + end) / 2, 2)
    record["machine_load"] = quiet_machine([load, end], threads=1)
    record["provenance"] = provenance(config=vars(args) | {"out": str(args.out)}, threads=1)
    out = headline_path(args.out, record["machine_load"], args.allow_loaded)  # a folder: <out>.loaded when loaded
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "profile.json", json.dumps(record, indent=2, default=str) + "\n")
    atomic_write_text(out / "README.md", markdown(record))


if __name__ == "__main__":
    main()
