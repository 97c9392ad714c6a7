"""``vla demo`` (what ``make demo`` runs): the whole pipeline on the embedded default, once per tokenizer.

    record push-v3 demonstrations (if missing) -> for FAST, binning and FSQ: fit the tokenizer on the training
    episodes, train a tiny policy with the same budget, evaluate it in closed loop on evaluation seeds
    -> one table (tokenizer, tokens per chunk, training time, final loss, success rate, latency)

Writes ``demo.json``, ``demo.md`` and ``demo.png`` to the output folder. ``--quick`` shrinks every stage to a
few minutes in all (a small dataset, a few steps, a few episodes): a smoke test, not a result.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from action_tokenizers.base import atomic_write_text
from vla import evaluate, train
from vla.config import BinConfig, FASTConfig, FSQConfig, PolicyOptions, TokenizerConfig, TrainConfig
from vla.sim import record


@dataclass
class DemoConfig:
    out_dir: Path = Path("outputs/demo")  # runs, demo.json, demo.md, demo.png
    dataset_root: Path = record.DEFAULT_DATASET_ROOT  # recorded here when missing
    task: str = record.DEFAULT_TASK
    record_episodes: int = record.DEFAULT_EPISODES
    record_action_noise: float = record.DEFAULT_ACTION_NOISE  # DART noise of the recording (vla.sim.record)
    tokenizers: dict[str, TokenizerConfig] = field(
        default_factory=lambda: {"fast": FASTConfig(), "bin": BinConfig(), "fsq": FSQConfig()}
    )
    # The state as prefix embeddings, not pi0-FAST's text: a model trained from scratch in minutes learns far
    # faster from it (README, "Training and the demo").
    policy: PolicyOptions = field(
        default_factory=lambda: PolicyOptions(time_horizon=10, n_action_steps=5, state_encoding="embedding")
    )
    steps: int = 3000  # training steps per tokenizer (the same budget for each)
    batch_size: int = 32
    lr: float = 3e-3
    eval_episodes: int = 50
    eval_envs: int = 25  # episodes run at once (their chunks decoded as one batch)
    max_steps: int = 150  # per evaluation episode: twice the longest expert episode (75 steps)

    @classmethod
    def quick(cls, out_dir: Path) -> DemoConfig:
        return cls(
            out_dir=out_dir,
            dataset_root=out_dir / "dataset",
            record_episodes=6,
            tokenizers={"fast": FASTConfig(), "bin": BinConfig(), "fsq": FSQConfig(steps=50, hidden=16, depth=0)},
            steps=20,
            batch_size=8,
            eval_episodes=2,
            max_steps=60,
        )


def run_demo(cfg: DemoConfig, log=print) -> dict[str, Any]:
    record.ensure_dataset(
        cfg.dataset_root, cfg.task, cfg.record_episodes, action_noise=cfg.record_action_noise, log=log
    )  # fmt: skip
    rows = {}
    for name, tok_cfg in cfg.tokenizers.items():
        log(f"== {name}: fit tokenizer, train {cfg.steps} steps, evaluate {cfg.eval_episodes} episodes")
        run_dir = cfg.out_dir / "runs" / name
        start = time.perf_counter()
        summary = train.main(
            TrainConfig(
                dataset_root=str(cfg.dataset_root),
                output_dir=str(run_dir),
                tokenizer=tok_cfg,
                policy=replace(cfg.policy),
                steps=cfg.steps,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                warmup_steps=min(100, cfg.steps // 10),
                save_every=cfg.steps,
                log_every=max(1, cfg.steps // 100),
            )
        )
        train_s = time.perf_counter() - start  # tokenizer fit + training
        start = time.perf_counter()
        report = evaluate.evaluate(
            summary["policy_path"], cfg.task, cfg.eval_episodes, max_steps=cfg.max_steps, num_envs=cfg.eval_envs,
            out_dir=run_dir / "eval",
        )  # fmt: skip
        eval_s = time.perf_counter() - start
        rows[name] = {
            "tokens_per_chunk": report["tokens_per_chunk"],
            "train_seconds": train_s,
            "eval_seconds": eval_s,
            "samples_per_s": summary["samples_per_s"],
            "final_loss": summary["final_loss"],
            "success_rate": report["success_rate"],
            "mean_return": report["mean_return"],
            "episodes": report["episodes"],
            "latency_ms_mean": report["latency_ms_mean"],
            "latency_ms_p95": report["latency_ms_p95"],
            "valid_chunk_rate": report["valid_chunk_rate"],
        }
        log(f"   {name}: success {report['success_rate']:.0%}, final loss {summary['final_loss']:.3f}")
    result = {
        "task": cfg.task,
        "dataset": str(cfg.dataset_root),
        "record_action_noise": cfg.record_action_noise,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "preset": cfg.policy.preset,
        "lr": cfg.lr,
        "state_encoding": cfg.policy.state_encoding,
        "time_horizon": cfg.policy.time_horizon,
        "n_action_steps": cfg.policy.n_action_steps,
        "tokenizers": rows,
    }
    write_outputs(result, cfg.out_dir)
    log(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['task']}, preset {result['preset']}, {result['steps']} steps x {result['batch_size']} per tokenizer "
        f"(lr {result.get('lr', '?')}, state as {result.get('state_encoding', 'text')}), T={result['time_horizon']}, "
        f"{result['n_action_steps']} actions per chunk executed\n",
        "| tokenizer | tokens/chunk | train time (s) | final loss | success | episodes | latency ms (mean / p95) | valid chunks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in result["tokenizers"].items():
        lines.append(
            f"| {name} | {r['tokens_per_chunk']:.1f} | {r['train_seconds']:.0f} | {r['final_loss']:.3f} | "
            f"{r['success_rate']:.0%} | {r['episodes']} | {r['latency_ms_mean']:.0f} / {r['latency_ms_p95']:.0f} | "
            f"{r['valid_chunk_rate']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "demo.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / "demo.md", markdown(result))
    names = list(result["tokenizers"])
    rows = [result["tokenizers"][n] for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(
        axes, ["success_rate", "tokens_per_chunk", "latency_ms_mean"], ["success rate", "tokens per chunk", "latency (ms)"]
    ):
        ax.bar(names, [r[key] for r in rows], color=["C0", "C1", "C2", "C3"][: len(names)])
        ax.set_title(label)
    fig.suptitle(f"{result['task']}: one tiny policy per tokenizer, same budget")
    fig.tight_layout()
    fig.savefig(out_dir / "demo.png", dpi=120)
    plt.close(fig)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the whole pipeline on the default dataset", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("outputs/demo"))
    p.add_argument("--quick", action="store_true", help="a few minutes in all: tiny dataset, few steps")
    p.add_argument("--steps", type=int, default=None, help="training steps per tokenizer")
    p.add_argument("--episodes", type=int, default=None, help="evaluation episodes per tokenizer")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = DemoConfig.quick(args.out) if args.quick else DemoConfig(out_dir=args.out)
    if args.steps is not None:
        cfg.steps = args.steps
    if args.episodes is not None:
        cfg.eval_episodes = args.episodes
    run_demo(cfg)
    print(f"wrote {cfg.out_dir / 'demo.json'}, demo.md and demo.png")
    return 0
