"""A run folder holds one run: its checkpoints (JSON + safetensors, written atomically), its config and its metrics.

    run/
      train_config.json        the run's config, written once the run is accepted (fresh, or a matching resume)
      metrics.jsonl            one row per logged step, never repeated (a resume drops the rows past its checkpoint)
      checkpoints/step_*/      policy, optimiser, EMA and random state; the newest ``keep_last`` are kept
      checkpoints/last.json    which checkpoint is the newest
      policy/                  the final policy (EMA weights)

``prepare_run`` is called before any work: a fresh start refuses a folder that already holds a run (unless told to
overwrite it), a resume names the checkpoint and step it continues from and refuses settings that cannot change
mid-run, and debris left by a killed save (``.NAME.tmp-*`` / ``.NAME.old-*`` folders) is removed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vla.io import atomic_directory, atomic_write_text, read_json

CHECKPOINTS = "checkpoints"
LAST = "last.json"
CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
FORMAT_VERSION = 1
RUN_FILES = (CHECKPOINTS, CONFIG, METRICS, "policy", "loss.png", "heldout.json", "heldout.png", "offline_report.json",
             "offline_report.md", "offline_report.png")
# Settings a resumed run may change: how long, how often it saves and logs, how it loads data, what it shows.
CHANGEABLE = {"steps", "save_every", "log_every", "keep_last", "num_workers", "progress", "resume", "overwrite",
              "mixed_precision", "eval_every", "eval_chunks", "report_chunks"}


def save_checkpoint(run: Path, step: int, policy, optimizer, ema: dict[str, torch.Tensor] | None, keep_last: int = 0) -> Path:
    """Everything needed to continue exactly, as JSON + safetensors, written atomically; older ones pruned."""
    target = run / CHECKPOINTS / f"step_{step:07d}"
    opt_state = optimizer.state_dict()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    tensors = {}
    for idx, state in opt_state["state"].items():
        for key, value in state.items():
            tensors[f"{names[idx]}.{key}"] = value.detach().cpu().contiguous()
    with atomic_directory(target) as tmp:
        policy.save_pretrained(tmp / "policy")
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch_rng": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        if ema is not None:
            save_file({k: v.contiguous() for k, v in ema.items()}, str(tmp / "ema.safetensors"))
        state = {"format_version": FORMAT_VERSION, "step": step, "param_groups": opt_state["param_groups"],
                 "param_names": names}  # fmt: skip
        atomic_write_text(tmp / "trainer_state.json", json.dumps(state) + "\n")
    atomic_write_text(run / CHECKPOINTS / LAST, json.dumps({"step": step, "path": target.name}) + "\n")
    if keep_last > 0:
        for old in sorted((run / CHECKPOINTS).glob("step_*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(run: Path) -> Path | None:
    pointer = run / CHECKPOINTS / LAST
    if not pointer.is_file():
        return None
    path = run / CHECKPOINTS / read_json(pointer, "checkpoint pointer")["path"]
    if not (path / "trainer_state.json").is_file():
        raise ValueError(f"{pointer} names {path.name}, which is missing or incomplete; remove {pointer} to resume "
                         "from an older checkpoint, or start again with --overwrite=true")  # fmt: skip
    return path


def load_checkpoint(path: Path, policy, optimizer) -> tuple[int, dict[str, torch.Tensor] | None]:
    """Restore optimiser, EMA and random state into a policy loaded from ``path / 'policy'``; returns the step."""
    state = read_json(path / "trainer_state.json", "checkpoint", format_version=FORMAT_VERSION, assume_version=1)
    tensors = load_file(str(path / "optimizer.safetensors"))
    names = state["param_names"]
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, field = key.rsplit(".", 1)
        opt_state.setdefault(names.index(name), {})[field] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    # Batches are a function of (seed, step) and numpy/python random are unused in a step; torch's is restored.
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_rng"])
    ema_path = path / "ema.safetensors"
    return state["step"], (load_file(str(ema_path)) if ema_path.is_file() else None)


def remove_debris(run: Path) -> list[Path]:
    """Delete what a killed atomic save left behind (hidden ``.NAME.tmp-*`` / ``.NAME.old-*`` folders and files)."""
    found = [p for folder in (run, run / CHECKPOINTS) for pattern in (".*.tmp-*", ".*.old-*") for p in folder.glob(pattern)]
    for path in found:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return found


def prepare_run(run: Path, encoded: dict[str, Any], *, resume: bool, overwrite: bool, log=print) -> Path | None:
    """Check the run folder before any work; returns the checkpoint to resume from (None for a fresh start).

    ``encoded`` is the new config as draccus writes it. Nothing in the folder changes if this raises.
    """
    if resume and overwrite:
        raise ValueError("--resume=true and --overwrite=true contradict each other; choose one")
    holds = [name for name in RUN_FILES if (run / name).exists()]
    if not resume:
        if holds and not overwrite:
            raise ValueError(f"{run} already holds a run ({', '.join(holds)}); resume it with --resume=true, choose "
                             "another --output_dir, or replace it with --overwrite=true")  # fmt: skip
        for name in holds:  # --overwrite: the old run goes entirely, so nothing mixes
            path = run / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        remove_debris(run)
        return None
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise ValueError(f"--resume=true but {run / CHECKPOINTS} holds no checkpoint; drop --resume to start fresh")
    saved = read_json(run / CONFIG, "the run's config") if (run / CONFIG).is_file() else None
    if saved is not None:
        new, old = _flatten(encoded), _flatten(saved)
        changed = sorted(k for k in new.keys() | old.keys() if k.split(".")[0] not in CHANGEABLE and new.get(k) != old.get(k))
        if changed:
            detail = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:6])
            raise ValueError(f"--resume=true with settings that cannot change mid-run ({detail}); resume with the "
                             f"run's own settings (see {run / CONFIG}), or start a new run in another --output_dir")  # fmt: skip
    for path in remove_debris(run):
        log(f"removed {path.name}, left by an interrupted save")
    step = read_json(checkpoint / "trainer_state.json", "checkpoint")["step"]
    log(f"resuming {run} from {checkpoint.relative_to(run)} at step {step}")
    metrics = run / METRICS
    if metrics.is_file():  # rows past the checkpoint were logged by the run that died: they are redone
        rows = [line for line in metrics.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        atomic_write_text(metrics, "".join(line + "\n" for line in rows))
    return checkpoint


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.loads(json.dumps(value, default=str))  # lists and tuples compare alike
    return out
