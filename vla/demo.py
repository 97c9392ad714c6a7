"""``vla demo`` (what ``make demo`` runs): one policy following instructions across Meta-World tasks, once per
tokenizer.

    record expert demonstrations of every task into one dataset (if missing) -> for each of
    configs/{fast,bin,fsq,beast}.yaml: fit the tokenizer on the training episodes, train one tiny multi-task policy
    (the instruction in its prompt) with that config's budget, evaluate it in closed loop on evaluation seeds of
    every task -> one table (tokenizer, tokens per chunk, training time, final loss, success per task and on average,
    latency)

The default task set (``DEMO_TASKS``) holds two pairs that start from alike scenes and differ in what the instruction
asks (drawer-open / drawer-close, window-open / window-close); ``vla demo --tasks mt10`` runs Meta-World's ten MT10
tasks. The runs are the files in ``configs/`` (``vla train --config_path configs/fast.yaml`` trains the same policy),
with only the dataset and the output folder set here. Writes ``demo.json``, ``demo.md``, ``demo.png`` and
``demo_tasks.png`` to the output folder. ``--quick`` shrinks every stage to a few minutes in all (a small dataset, a
few steps, a few episodes): a smoke test, not a result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vla import evaluate, train
from vla.config import load_config
from vla.io import atomic_write_text, save_figure, write_json
from vla.provenance import provenance
from vla.sim import record


def configs_dir(here: Path | None = None) -> Path:
    """The experiment files (``vla.config.shipped_configs``: the checkout's ``configs/``, or the copy an installed
    wheel carries), or a clear error when neither is there; ``here`` is the ``vla`` package's folder."""
    from vla.config import shipped_configs

    here = here or Path(__file__).resolve().parent
    found = shipped_configs(here)
    if found is None:
        raise FileNotFoundError(
            f"no configs/ beside {here} nor inside it; reinstall the package (pip install "
            "vla-action-tokenizers) or run from a checkout"
        )
    return found


CONFIGS_DIR = configs_dir()


DEMO_TASKS = "metaworld/push-v3,drawer-open-v3,drawer-close-v3,window-open-v3,window-close-v3"
DEMO_EPISODES = 40  # per task


@dataclass
class DemoConfig:
    out_dir: Path = Path("outputs/demo")  # runs, demo.json, demo.md, demo.png
    dataset_root: Path = Path("outputs/datasets/metaworld_demo")  # recorded here when missing
    env: str = DEMO_TASKS  # the tasks (vla.sim.env_names): a comma list or a set such as metaworld/mt10
    record_episodes: int = DEMO_EPISODES  # per task
    record_action_noise: float = record.DEFAULT_ACTION_NOISE  # DART noise of the recording (vla.sim.record)
    configs: list[str] = field(default_factory=lambda: ["fast", "bin", "fsq", "beast"])  # configs/<name>.yaml
    overrides: list[str] = field(default_factory=list)  # draccus overrides for every run (--quick shrinks them)
    run_overrides: dict[str, list[str]] = field(default_factory=dict)  # ... and for one config's run
    eval_episodes: int = 50
    eval_envs: int = 25  # episodes run at once (their chunks decoded as one batch)
    max_steps: int = 200  # per evaluation episode: twice the longest successful expert episode (96 steps)

    @classmethod
    def quick(cls, out_dir: Path) -> DemoConfig:
        return cls(
            out_dir=out_dir,
            dataset_root=out_dir / "dataset",
            env="metaworld/drawer-open-v3,drawer-close-v3",
            record_episodes=3,
            overrides=["--steps=20", "--batch_size=8", "--log_every=5", "--policy.scheduler_warmup_steps=2"],
            run_overrides={"fsq": ["--tokenizer.type=fsq", "--tokenizer.steps=50", "--tokenizer.hidden=16"]},
            configs=["fast", "bin", "fsq"],
            eval_episodes=2,
            max_steps=60,
        )

    def train_config(self, name: str):
        """The run of ``configs/<name>.yaml`` on this demo's dataset, into this demo's folder."""
        path = CONFIGS_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ValueError(f"no config {path}; the demo runs the files in {CONFIGS_DIR} (e.g. fast, bin, fsq)")
        args = [
            f"--dataset_root={self.dataset_root}",
            f"--output_dir={self.out_dir / 'runs' / name}",
            "--overwrite=true",
            *self.overrides,
            *self.run_overrides.get(name, []),
        ]
        cfg = load_config(str(path), args)
        cfg.save_every = cfg.steps
        return cfg


def run_demo(cfg: DemoConfig, log=print) -> dict[str, Any]:
    record.ensure_dataset(cfg.dataset_root, cfg.env, cfg.record_episodes, action_noise=cfg.record_action_noise, log=log)
    rows, run_cfg = {}, None
    for name in cfg.configs:
        run_cfg = cfg.train_config(name)
        tok_name = run_cfg.tokenizer.type
        log(f"== {name}: fit {tok_name}, train {run_cfg.steps} steps, evaluate {cfg.eval_episodes} episodes")
        start = time.perf_counter()
        summary = train.main(run_cfg)
        train_s = time.perf_counter() - start  # tokenizer fit + training
        start = time.perf_counter()
        report = evaluate.evaluate(
            summary["policy_path"],
            cfg.env,
            cfg.eval_episodes,
            max_steps=cfg.max_steps,
            num_envs=cfg.eval_envs,
            out_dir=Path(run_cfg.output_dir) / "eval",
        )
        eval_s = time.perf_counter() - start
        rows[tok_name] = {
            "config": f"configs/{name}.yaml",
            "tasks": evaluate.task_rates(report),
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
        log(f"   {tok_name}: success {report['success_rate']:.0%}, final loss {summary['final_loss']:.3f}")
    policy = run_cfg.policy
    result = {
        "task": cfg.env,
        "episodes_per_task": cfg.eval_episodes,
        "record_episodes_per_task": cfg.record_episodes,
        "dataset": str(cfg.dataset_root),
        "record_action_noise": cfg.record_action_noise,
        "steps": run_cfg.steps,
        "batch_size": run_cfg.batch_size,
        "preset": policy.preset,
        "lr": policy.optimizer_lr,
        "state_encoding": policy.state_encoding,
        "time_horizon": policy.time_horizon,
        "n_action_steps": policy.n_action_steps,
        "tokenizers": rows,
        "provenance": provenance(
            config=json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), dataset=cfg.dataset_root
        ),
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
    rates = {name: r["tasks"] for name, r in result["tokenizers"].items() if "tasks" in r}
    if rates and len(next(iter(rates.values()))) > 1:
        lines += [
            "",
            f"Success per task ({result.get('episodes_per_task', '?')} evaluation episodes each):",
            "",
            evaluate.task_table(rates).rstrip(),
        ]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "demo.json", result)
    atomic_write_text(out_dir / "demo.md", markdown(result))
    names = list(result["tokenizers"])
    rows = [result["tokenizers"][n] for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(
        axes,
        ["success_rate", "tokens_per_chunk", "latency_ms_mean"],
        ["success rate", "tokens per chunk", "latency (ms)"],
    ):
        ax.bar(names, [r[key] for r in rows], color=["C0", "C1", "C2", "C3"][: len(names)])
        ax.set_title(label)
    from vla.sim import env_names

    tasks = env_names(result["task"])
    fig.suptitle(f"{len(tasks)} {result['task'].split('/')[0]} task(s): one tiny policy per tokenizer, same budget")
    fig.tight_layout()
    save_figure(fig, out_dir / "demo.png")
    rates = {name: r["tasks"] for name, r in result["tokenizers"].items() if "tasks" in r}
    if rates:
        n = len(next(iter(rates.values())))
        evaluate.plot_tasks(
            rates, out_dir / "demo_tasks.png", title=f"{n} tasks, one policy per tokenizer: success per task"
        )


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the whole pipeline on the default dataset", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("outputs/demo"))
    p.add_argument("--quick", action="store_true", help="a few minutes in all: tiny dataset, few steps")
    p.add_argument("--steps", type=int, default=None, help="training steps per tokenizer")
    p.add_argument("--episodes", type=int, default=None, help="evaluation episodes per task and tokenizer")
    p.add_argument(
        "--tasks",
        default=None,
        help=f"Meta-World tasks: a set (mt10) or a comma list (default: {DEMO_TASKS.split('/')[1]}); the dataset goes "
        "to outputs/datasets/metaworld_<tasks>",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = DemoConfig.quick(args.out) if args.quick else DemoConfig(out_dir=args.out)
    if args.steps is not None:
        cfg.overrides.append(f"--steps={args.steps}")
    if args.episodes is not None:
        cfg.eval_episodes = args.episodes
    if args.tasks is not None:
        cfg.env = f"metaworld/{args.tasks}"
        cfg.dataset_root = Path("outputs/datasets") / f"metaworld_{args.tasks.replace(',', '+')}"
    run_demo(cfg)
    print(f"wrote {cfg.out_dir / 'demo.json'}, demo.md and demo.png")
    return 0
