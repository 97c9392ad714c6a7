"""A run folder holds one run: its checkpoints (JSON + safetensors, written atomically), its config and its metrics.

    run/
      train_config.json        the run's config, written once the run is accepted (fresh, or a matching resume)
      dataset.json             the fingerprint of the data it trains on (``vla.provenance.dataset_fingerprint``)
      metrics.jsonl            one row per logged step, never repeated (a resume drops the rows past its checkpoint)
      checkpoints/step_*/      policy, optimiser, EMA and random state; the newest ``keep_last`` are kept
      checkpoints/last.json    which checkpoint is the newest
      policy/                  the final policy (EMA weights)
      loss.png                 the training loss
      heldout.json, heldout.png, offline_report.{json,md,png}   with held-out episodes (``vla.heldout``)

``vla.run_folder.RunFolder`` names these files once, for the trainer, the study runner, the defaults and the
evaluation.

``prepare_run`` is called before any work: it checks that ``output_dir`` can be written; a fresh start refuses a
folder that already holds a run (unless told to overwrite it), but starts again in place a run that saved nothing to
resume from (stopped or diverged before its first checkpoint); a resume names the checkpoint and step it continues
from and refuses settings that cannot change mid-run (paths compared as the folders they name) and a dataset whose
files changed since the run started (re-recorded or extended: the two would mix); and debris left by a
killed save (``.NAME.tmp-*`` / ``.NAME.old-*`` folders) is removed. A save that meets a full disk stops with one line
naming the folder, the space it needs and the fix (``no_space``); nothing half-written stays.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vla.io import atomic_directory, atomic_write_text, read_json
from vla.run_folder import CHECKPOINTS, CONFIG, LAST, POLICY, RUN_FILES, TRAINER_STATE, RunFolder

FORMAT_VERSION = 1
# Settings a resumed run may change: how long, how often it saves and logs, how it loads data, what it shows.
# output_dir is the folder being resumed, however it is spelled (a run folder may move).
CHANGEABLE = {
    "steps",
    "save_every",
    "log_every",
    "keep_last",
    "num_workers",
    "progress",
    "resume",
    "overwrite",
    "mixed_precision",
    "eval_every",
    "eval_chunks",
    "report_chunks",
    "output_dir",
}
# Settings that name a file or folder: equal when they name the same one (`ds` from /data and `/data/ds` agree).
PATHS = {
    "dataset_root",
    "tokenizer.pretrained_path",
    "policy.backbone_path",
    "policy.action_tokenizer_path",
    "policy.pretrained_path",
}
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write met a full disk; the message names the folder, the space needed and the fix."""


def save_checkpoint(
    run: Path, step: int, policy, optimizer, ema: dict[str, torch.Tensor] | None, keep_last: int = 0
) -> Path:
    """Everything needed to continue exactly, as JSON + safetensors, written atomically; older ones pruned."""
    target = RunFolder(run).checkpoint(step)
    opt_state = optimizer.state_dict()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    tensors = {}
    for idx, state in opt_state["state"].items():
        for key, value in state.items():
            tensors[f"{names[idx]}.{key}"] = value.detach().cpu().contiguous()
    need = _nbytes(policy.state_dict().values()) + _nbytes(tensors.values()) + _nbytes((ema or {}).values())
    try:
        with atomic_directory(target) as tmp:
            policy.save_pretrained(tmp / POLICY)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            save_file({"torch_rng": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
            if ema is not None:
                save_file({k: v.contiguous() for k, v in ema.items()}, str(tmp / "ema.safetensors"))
            state = {
                "format_version": FORMAT_VERSION,
                "step": step,
                "param_groups": opt_state["param_groups"],
                "param_names": names,
            }
            atomic_write_text(tmp / TRAINER_STATE, json.dumps(state) + "\n")
        atomic_write_text(run / CHECKPOINTS / LAST, json.dumps({"step": step, "path": target.name}) + "\n")
    except Exception as err:  # the temporary folder is gone: the last complete checkpoint stays the last
        full = no_space(err, run, f"the checkpoint of step {step}", need)
        if full is None:
            raise
        raise full from None
    if keep_last > 0:
        for old in RunFolder(run).saved_checkpoints()[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(run: Path) -> Path | None:
    """The checkpoint ``last.json`` names; without one (a kill between a save's rename and the pointer's write) the
    newest complete ``step_*`` folder (each is renamed into place whole); None when there is none."""
    pointer = run / CHECKPOINTS / LAST
    if not pointer.is_file():
        done = [p for p in RunFolder(run).saved_checkpoints() if (p / TRAINER_STATE).is_file()]
        return done[-1] if done else None
    path = run / CHECKPOINTS / read_json(pointer, "checkpoint pointer")["path"]
    if not (path / TRAINER_STATE).is_file():
        raise ValueError(
            f"{pointer} names {path.name}, which is missing or incomplete; remove {pointer} to resume "
            "from an older checkpoint, or start again with --overwrite=true"
        )
    return path


def load_checkpoint(path: Path, policy, optimizer) -> tuple[int, dict[str, torch.Tensor] | None]:
    """Restore optimiser, EMA and random state into a policy loaded from ``path / 'policy'``; returns the step."""
    state = read_json(path / TRAINER_STATE, "checkpoint", format_version=FORMAT_VERSION, assume_version=1)
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
    found = [
        p for folder in (run, run / CHECKPOINTS) for pattern in (".*.tmp-*", ".*.old-*") for p in folder.glob(pattern)
    ]
    for path in found:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return found


def prepare_run(
    run: Path,
    encoded: dict[str, Any],
    *,
    resume: bool,
    overwrite: bool,
    fingerprint: dict[str, Any] | None = None,
    log=print,
) -> Path | None:
    """Check the run folder before any work; returns the checkpoint to resume from (None for a fresh start).

    ``encoded`` is the new config as draccus writes it; ``fingerprint`` that of the dataset it names now, checked
    on a resume against the one the run recorded. Nothing in the folder changes if this raises.
    """
    if resume and overwrite:
        raise ValueError("--resume=true and --overwrite=true contradict each other; choose one")
    check_writable(run)
    holds = [name for name in RUN_FILES if (run / name).exists()]
    # A run that saved nothing to resume from (stopped, diverged or out of space before its first checkpoint) left
    # only its config and first metrics rows: starting it again in place loses nothing.
    unsaved = bool(holds) and not RunFolder(run).saved_checkpoints() and not (run / POLICY).exists()
    if not resume:
        if holds and not overwrite and not unsaved:
            raise ValueError(
                f"{run} already holds a run ({', '.join(holds)}); resume it with --resume=true, choose "
                "another --output_dir, or replace it with --overwrite=true"
            )
        if unsaved and not overwrite:
            log(f"{run} holds a run that saved no checkpoint ({', '.join(holds)}): starting it again from step 0")
        _remove(run, holds)
        return None
    checkpoint = latest_checkpoint(run)
    if checkpoint is None and unsaved:  # nothing to continue, so nothing to keep: the run starts again as given
        log(f"{run} holds a run that saved no checkpoint ({', '.join(holds)}): starting it again from step 0")
        _remove(run, holds)
        return None
    if checkpoint is None:
        if holds:
            raise ValueError(
                f"--resume=true but {run} holds no checkpoint to resume from (it holds "
                f"{', '.join(holds)}); replace the run with --overwrite=true, or choose another "
                "--output_dir"
            )
        raise ValueError(f"--resume=true but {run / CHECKPOINTS} holds no checkpoint; drop --resume to start fresh")
    _check_unchanged(run, encoded)
    _check_same_data(run, checkpoint, encoded.get("dataset_root"), fingerprint)
    for path in remove_debris(run):
        log(f"removed {path.name}, left by an interrupted save")
    step = read_json(checkpoint / TRAINER_STATE, "checkpoint")["step"]
    log(f"resuming {run} from {checkpoint.relative_to(run)} at step {step}")
    folder = RunFolder(run)
    if folder.metrics.is_file():  # rows past the checkpoint were logged by the run that died: they are redone
        rows = [row for row in folder.metrics_rows() if row.get("step", 0) <= step]  # a torn last line is dropped
        atomic_write_text(folder.metrics, "".join(json.dumps(row) + "\n" for row in rows))
    return checkpoint


def _remove(run: Path, names: list[str]) -> None:
    """Delete the old run's files (all of them, so nothing mixes) and any debris of interrupted saves."""
    for name in names:
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    remove_debris(run)


def _check_unchanged(run: Path, encoded: dict[str, Any]) -> None:
    """Refuse a resume whose settings differ from the run's own, but for those that may change (``CHANGEABLE``);
    paths are compared as the folders they name, resolved from the working directory."""
    saved = read_json(run / CONFIG, "the run's config") if (run / CONFIG).is_file() else None
    if saved is None:
        return
    new, old = _flatten(encoded), _flatten(saved)
    changed = sorted(
        k for k in new.keys() | old.keys() if k.split(".")[0] not in CHANGEABLE and not _same(k, old.get(k), new.get(k))
    )
    if changed:
        detail = "; ".join(_change(k, old.get(k), new.get(k)) for k in changed[:6])
        raise ValueError(
            f"--resume=true with settings that cannot change mid-run ({detail}); resume with the "
            f"run's own settings (see {run / CONFIG}), or start a new run in another --output_dir"
        )


def _check_same_data(run: Path, checkpoint: Path, root: Any, fingerprint: dict[str, Any] | None) -> None:
    """Refuse a resume on data other than the run's own: the same folder re-recorded or extended would mix two
    datasets in one run (its normalisation, tokenizer and split come from the first). A run that recorded no
    fingerprint (made before runs kept one) is not checked."""
    saved = RunFolder(run).dataset
    if fingerprint is None or not saved.is_file():
        return
    before = read_json(saved, "the run's dataset fingerprint")
    if before.get("sha256") != fingerprint.get("sha256"):
        raise ValueError(
            f"--resume=true but the dataset at {root} is not the one this run started on: its files changed "
            f"({before.get('files')} files, sha256 {str(before.get('sha256'))[:12]}... then; {fingerprint.get('files')} "
            f"files, sha256 {str(fingerprint.get('sha256'))[:12]}... now), so a resume would train on two datasets "
            "under the first one's normalisation, tokenizer and split. Train a new run in another --output_dir, or "
            f"fine-tune the last checkpoint's weights on the new data with --policy.path={checkpoint / POLICY}"
        )


def _resolved(value: Any) -> Any:
    return str(Path(os.path.expanduser(value)).resolve()) if isinstance(value, str) and value else value


def _same(key: str, old: Any, new: Any) -> bool:
    return old == new or key in PATHS and _resolved(old) == _resolved(new)


def _change(key: str, old: Any, new: Any) -> str:
    """``key: old -> new``, with the folders the paths name when their spellings hide them."""
    line = f"{key}: {old!r} -> {new!r}"
    if key in PATHS and isinstance(old, str) and isinstance(new, str):
        shown = [f"{v!r} is {_resolved(v)}" for v in (old, new) if _resolved(v) != v]
        line += f" (different folders{': ' + ', '.join(shown) if shown else ''})"
    return line


def check_writable(run: Path) -> None:
    """Refuse an ``output_dir`` that cannot become a folder here (a file, under a file, unwritable), naming the path
    and the fix, before any work and without leaving anything (the probe is a temporary folder, removed)."""
    if run.exists() and not run.is_dir():
        raise ValueError(f"--output_dir {run} is a file, not a folder; choose another --output_dir")
    existing = run
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ValueError(
            f"--output_dir {run} cannot be created: {existing} is a file, not a folder; choose another "
            "--output_dir (or move that file)"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vla-write-check-", dir=existing))
    except OSError as err:
        reason = err.strerror or str(err)
        raise ValueError(
            f"--output_dir {run} cannot be written: {existing} refuses new files ({reason}); choose a "
            "folder you can write (e.g. outputs/train/NAME), or give yourself write access to "
            f"{existing}"
        ) from None


def no_space(err: BaseException, run: Path, what: str, need: int | None = None) -> OSError | None:
    """The one-line error for a write that met a full disk (or quota), naming the folder, the space ``what`` needs
    (bytes, when known), the space left and the fix; None when ``err`` is something else. safetensors reports a
    full disk as its own error type, recognised by the OS's words."""
    if isinstance(err, DiskFull):  # already says what it needed
        return err
    text = str(err)
    if not (
        isinstance(err, OSError)
        and err.errno in NO_SPACE
        or "No space left" in text
        or "StorageFull" in text
        or "Disk quota exceeded" in text
    ):
        return None
    folder = run
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    try:
        last = latest_checkpoint(run)
    except ValueError:
        last = None
    kept = (
        f"the last checkpoint ({last.relative_to(run)}) is intact"
        if last is not None
        else "no checkpoint was written yet"
    )
    again = "resume with --resume=true" if last is not None else "run the same command again"
    full = DiskFull(
        f"no space left on the disk of {run} to write {what}: it needs about "
        f"{_size(need) if need else 'more than is free'}, {_size(free)} are free; nothing was half-written "
        f"and {kept}. Free space there (older runs, or --keep_last=1 to keep fewer checkpoints) or move the "
        f"run folder to a disk with room, then {again}"
    )
    full.errno = errno.ENOSPC
    return full


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _size(n: float) -> str:
    """Bytes as B / KB / MB / GB, one decimal."""
    units = ["B", "KB", "MB", "GB", "TB"]
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.loads(json.dumps(value, default=str))  # lists and tuples compare alike
    return out
