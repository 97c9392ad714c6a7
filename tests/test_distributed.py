"""Training in two processes on CPU, launched the way a user launches it on GPUs (``accelerate launch``, gloo here).

One uninterrupted two-process run and one that stops at step 2 and is resumed to step 4 are compared with each
other and with a single process on the same global batch:
    (a) the ranks see disjoint halves of every global batch;
    (b) the gradients are averaged: after 4 steps the weights equal the single process's (the models have no
        dropout, so the runs are deterministic up to the order of float sums);
    (c) only rank 0 writes the run folder (checkpoints, metrics, plots, the final policy) and prints;
    (d) a two-process resume ends where the uninterrupted two-process run ends.

This module is also the worker the launcher starts (``python -m tests.test_distributed RECORD_DIR vla-train-args``
from the repository root: run as a file, ``tests/`` would come first on the path and its ``action_tokenizers`` test
folder would shadow the library); it records which samples its rank's sampler gave and which files its rank wrote,
then runs ``vla train``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORLD = 2
STEPS = 4
BATCH = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_args(root: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """configs/debug.yaml (the tiny policy, FAST, no EMA) on the fixture dataset, shortened."""
    return [
        "--config_path=configs/debug.yaml",
        f"--dataset_root={root}",
        f"--output_dir={out}",
        f"--steps={steps}",
        f"--batch_size={BATCH}",
        "--save_every=2",
        "--log_every=1",
        "--keep_last=0",
        "--policy.device=cpu",
        *extra,
    ]


def launch(args: list[str], record: Path) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes 2`` (accelerate's multi-process launcher, torchrun inside) with
    no GPU visible: accelerate then joins the processes over gloo on the CPU."""
    record.mkdir(parents=True)
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        f"--num_processes={WORLD}",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
        "--log_dir",
        str(record / "logs"),
        "--tee",
        "3",
        "-m",
        "tests.test_distributed",
        str(record),
        *args,
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=Path(__file__).parents[1], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"two-process run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


def rank_record(record: Path, rank: int) -> dict:
    return json.loads((record / f"rank{rank}.json").read_text())


def rank_log(record: Path, rank: int, stream: str) -> str:
    """What ``rank`` printed (torchrun's per-rank copy of its stdout / stderr)."""
    (path,) = (record / "logs").rglob(f"attempt_0/{rank}/{stream}.log")
    return path.read_text()


def weights(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(run / "policy" / "model.safetensors"))


def metric_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow  # three two-process launches (each process imports torch, transformers and lerobot)
def test_two_processes_train_like_one(tiny_dataset_root, tmp_path):
    from vla import train
    from vla.config import load_config

    straight = tmp_path / "straight"
    done = launch(train_args(tiny_dataset_root, straight, STEPS), tmp_path / "record_straight")

    # (a) each rank's sampler gave its own half of every global batch, and together the whole batch
    ranks = [rank_record(tmp_path / "record_straight", r) for r in range(WORLD)]
    assert all(r["world"] == WORLD and r["rank"] == i for i, r in enumerate(ranks))
    n = ranks[0]["dataset_len"]
    one = train.StepBatchSampler(n, BATCH, seed=0, start_step=0, steps=STEPS)  # the single process's batches
    assert [len(b) for b in ranks[0]["batches"]] == [BATCH // WORLD] * STEPS
    for step, global_batch in enumerate(one):
        halves = [r["batches"][step] for r in ranks]
        assert not set(halves[0]) & set(halves[1]), (
            f"step {step}: both ranks trained on {set(halves[0]) & set(halves[1])}"
        )
        assert sorted(halves[0] + halves[1]) == sorted(global_batch)

    # (c) rank 0 alone wrote the run folder and printed; the metrics hold each step once
    assert ranks[1]["writes"] == []
    assert {"prepare_run", "save_checkpoint", "save_pretrained", "plot_loss"} <= set(ranks[0]["writes"])
    assert sorted(p.name for p in (straight / "checkpoints").glob("step_*")) == ["step_0000002", "step_0000004"]
    assert [r["step"] for r in metric_rows(straight)] == list(range(1, STEPS + 1))
    record = tmp_path / "record_straight"
    assert "final loss" in rank_log(record, 0, "stdout") and "final loss" not in rank_log(record, 1, "stdout")
    assert done.stdout.count("final loss") == 1
    assert "train:" in rank_log(record, 0, "stderr") and "train:" not in rank_log(record, 1, "stderr")  # tqdm bar

    # (b) one process on the same global batch of 4 takes the same steps: the gradients are averaged
    single = tmp_path / "single"
    cfg = load_config(args=train_args(tiny_dataset_root, single, STEPS, "--progress=false"))
    summary = train.main(cfg)
    two, one_proc = weights(straight), weights(single)
    assert two.keys() == one_proc.keys()
    worst = max(float(np.abs(two[k] - one_proc[k]).max()) for k in two)
    assert worst < 1e-5, f"two processes drifted {worst:.2e} from one process on the same global batch"
    init = weights_at_init(cfg)
    moved = max(float(np.abs(two[k] - init[k]).max()) for k in two)
    print(f"two processes vs one: largest weight difference {worst:.2e}; training moved weights by up to {moved:.2e}")
    assert moved > 100 * worst  # the comparison means something: training moved the weights far more than that
    # the logged loss is the global batch's (token-weighted over the ranks), as the single process logs it
    np.testing.assert_allclose([r["loss"] for r in metric_rows(straight)], summary["losses"], rtol=1e-4)

    # (d) two processes stopped at step 2 and resumed to step 4 end where the uninterrupted run ends
    resumed = tmp_path / "resumed"
    launch(train_args(tiny_dataset_root, resumed, 2), tmp_path / "record_first")
    again = launch(train_args(tiny_dataset_root, resumed, STEPS, "--resume=true"), tmp_path / "record_resume")
    assert again.stdout.count("resuming") == 1
    after = [rank_record(tmp_path / "record_resume", r) for r in range(WORLD)]
    assert [r["batches"] for r in after] == [r["batches"][2:] for r in ranks]  # the batches the straight run saw
    assert after[1]["writes"] == []
    back = weights(resumed)
    assert max(float(np.abs(back[k] - two[k]).max()) for k in two) < 1e-6
    np.testing.assert_allclose(
        [r["loss"] for r in metric_rows(resumed)], [r["loss"] for r in metric_rows(straight)], rtol=1e-6
    )


def weights_at_init(cfg) -> dict[str, np.ndarray]:
    """The policy's initial weights (the seed fixes them): what training moves away from."""
    from vla.data import reader
    from vla.policy.factory import build_policy

    info = reader.dataset_info(cfg.dataset_root)
    train_eps, _ = reader.split_episodes(info, heldout=cfg.heldout_episodes, seed=cfg.seed)
    policy = build_policy(cfg, info, train_eps)
    return {k: v.detach().numpy() for k, v in policy.state_dict().items()}


# --- the worker: one rank of a launched run --------------------------------------------------------------------
def _worker(record: Path, args: list[str]) -> int:
    from vla import cli, train
    from vla.policy import VLAPolicy

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seen: dict = {"rank": rank, "world": world, "batches": [], "writes": [], "dataset_len": None}

    iterate = train.StepBatchSampler.__iter__

    def recorded_iter(self):
        seen["dataset_len"] = self.n
        for batch in iterate(self):
            seen["batches"].append(batch)
            yield batch

    train.StepBatchSampler.__iter__ = recorded_iter

    def noting(name, fn):
        def wrapper(*a, **kw):
            seen["writes"].append(name)
            return fn(*a, **kw)

        return wrapper

    for name in ("prepare_run", "save_checkpoint", "plot_loss", "atomic_write_text"):
        setattr(train, name, noting(name, getattr(train, name)))
    VLAPolicy.save_pretrained = noting("save_pretrained", VLAPolicy.save_pretrained)
    code = cli.main(["--debug", "train", *args])
    (record / f"rank{rank}.json").write_text(json.dumps(seen))
    return code


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1]), sys.argv[2:]))
