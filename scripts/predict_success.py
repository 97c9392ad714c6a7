#!/usr/bin/env python
"""Which quantity measured without a simulator predicts closed-loop success? Every traced study run
(``results/<study>/runs.json``, and the finished runs of a study still running: ``outputs/studies/<study>/*/run.json``)
gives its success rate and its training-time quantities (final loss, ids per chunk); every run whose policy is still
on disk is measured on episodes recorded for this (seeds no training recording or evaluation uses):

    python scripts/predict_success.py [--results results] [--work outputs/studies] \\
        [--heldout TRAINING_DATASET=HELDOUT_DATASET ...] [--chunks 128] [--out results/predictor]

The default held-out datasets (one per training dataset whose policies are on disk), recorded with the training
recording's settings on layout seeds 500000.. (``vla data record --seed 500000 ...``; the README gives each
command).

Measured on a fixed subset of held-out chunks (``vla.heldout.Heldout``) and on every held-out episode's first frame:
    first_action_rmse  the decoded chunk's first action against the recorded one, RMSE in action units (mean over
                       dimensions)
    chunk_rmse         the whole chunk, the same way (steps past the episode's end left out)
    accuracy, heldout_loss   teacher-forced next-id accuracy and cross-entropy on the held-out chunks' ids
    collapse           the spread (std over episodes) of the first predicted action at the episodes' first frames
                       against the recorded first actions' spread at the same frames, per dimension; the smallest
                       ratio over the dimensions whose recorded spread is not nil (1: as varied as the expert; 0: the
                       same action whatever the scene)
    tokens_per_chunk   ids per decoded chunk (on the held-out observations)
    tokenizer_rmse     the held-out chunks through the policy's own tokenizer and back (no model), RMSE in action units
    final_loss         the training loss at the last step (from the run)
Beside them, for reference only, a run's ``eval_tokens_per_chunk``: the ids per chunk its policy decoded during its
closed-loop evaluation (``runs.json``'s ``tokens_per_chunk``). It needs the simulator, and reflects what the policy
did there, so it is no candidate; and ``tokenizer_only``: the mean success of the other runs of the run's
tokenizer in the pool, what knowing the tokenizer alone predicts (a quantity that merely tells tokenizers apart
does as well as it, and no better).

For each quantity and each pool of runs (a study; the runs of one task and observation; one task), Spearman's rank
correlation with success over the runs (cells), with a bootstrap 95% interval (cells resampled with replacement, a
fixed seed), and the mean of the same correlation taken among each tokenizer's own runs (seeds and settings). Writes ``predictor.json`` (every run, every measurement, every correlation, with provenance; the
measurements of policies already measured on the same held-out data are reused), ``README.md`` (the tables) and
``predictor.png`` (success against the best-ranked measured quantities).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.reader import read_recording
from vla.io import atomic_write_text, save_figure, write_json
from vla.provenance import provenance
from vla.run_folder import StudyRunFolder

MIN_CELLS = 5  # fewer runs than this give no correlation (with 4, rho takes only a handful of values)
N_BOOT = 2000
BOOT_SEED = 0
GOOD = 0.8  # |rho| a cheap predictor must reach, its sign the expected one
SPREAD_FLOOR = 1e-3  # action units: a recorded first-action spread below this is nil (a dimension held constant)
# quantity -> the sign of its correlation with success if it predicts it (smaller error, more success; 0: either)
EXPECTED = {
    "first_action_rmse": -1,
    "chunk_rmse": -1,
    "accuracy": 1,
    "heldout_loss": -1,
    "collapse": 1,
    "tokens_per_chunk": 0,  # no direction expected: fewer ids are easier to predict, more keep more detail
    "eval_tokens_per_chunk": 0,
    "tokenizer_only": 1,
    "tokenizer_rmse": -1,
    "final_loss": -1,
}
RUN_QUANTITIES = ("final_loss", "eval_tokens_per_chunk")  # in every run's record, measured for none
# references, not candidates: measured in the simulator; the success of the run's tokenizer's other runs
REFERENCES = ("eval_tokens_per_chunk", "tokenizer_only")


# --- runs ----------------------------------------------------------------------------------------------------
def study_runs(runs_json: Path, work: Path | None) -> list[dict[str, Any]]:
    """The runs of one study: ``runs_json``'s, then any finished run in ``work/<study>/*/run.json`` it lacks (a
    study still running), each with the study's name, task and observation. Empty for a file of another format."""
    record = json.loads(runs_json.read_text())
    study = record.get("study")
    if not isinstance(study, dict) or not all("id" in r for r in record.get("runs", [])):
        return []
    runs = list(record["runs"])
    folder = work / study["name"] if work is not None else None
    if folder is not None and folder.is_dir():
        known = {r["id"] for r in runs}
        extra = [json.loads(p.read_text()) for p in sorted(folder.glob("*/run.json"))]
        runs += [r for r in extra if r["id"] not in known]
    task = study["eval"]["task"]
    observation = "pixels" if "--images" in study.get("record", []) else "state"
    return [cell(r, study["name"], study["dataset"], task, observation) for r in runs]


def cell(run: dict[str, Any], study: str, dataset: str, task: str, observation: str) -> dict[str, Any]:
    """One run's row: who it is, its success (and the first and last evaluation seed), its training-time quantities,
    and a key that is the same for the same training reused by two studies (its provenance)."""
    episode_seeds = run.get("episode_seeds") or [None]
    return {
        "study": study,
        "dataset": dataset,
        "id": run["id"],
        "tokenizer": run["tokenizer"],
        "setting": run["setting"],
        "seed": run["seed"],
        "task": task,
        "observation": observation,
        "success_rate": run["success_rate"],
        "eval_seeds": [min(episode_seeds), max(episode_seeds)] if episode_seeds[0] is not None else None,
        "final_loss": run["final_loss"],
        "eval_tokens_per_chunk": run["tokens_per_chunk"],
        "key": json.dumps(run.get("provenance"), sort_keys=True),
    }


def read_runs(results: Path, work: Path | None) -> list[dict[str, Any]]:
    """Every study's runs, a training that two studies share kept once (under the first study, by name)."""
    cells, seen = [], {}
    for path in sorted(results.glob("*/runs.json")):
        for c in study_runs(path, work):
            if c["key"] in seen:
                seen[c["key"]]["also_in"].append(c["study"])
                continue
            c["also_in"] = []
            seen[c["key"]] = c
            cells.append(c)
    return cells


def task_name(task: str) -> str:
    """A pool's name for an evaluation's task list: the task, or how many tasks."""
    return task if "," not in task else f"{len(task.split(','))} tasks"


def pools(cells: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The groups a correlation is taken over: each study; each task and observation, with every tokenizer and with
    one (seeds and settings only); each task. Those with fewer than ``MIN_CELLS`` runs dropped, and a pool that
    holds the same runs as one before it. A study's pool holds its own runs, shared ones included."""
    out: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        task = task_name(c["task"])
        for study in (c["study"], *c["also_in"]):
            out.setdefault(f"study {study}", []).append(c)
        out.setdefault(f"{task} from {c['observation']}", []).append(c)
        out.setdefault(f"{task} from {c['observation']}, {c['tokenizer']} only", []).append(c)
        out.setdefault(task, []).append(c)
    unique = {}
    for name, members in out.items():  # a one-study task's pools are the same runs: keep the first name
        ids = tuple(sorted(id(c) for c in members))
        if len(members) >= MIN_CELLS and ids not in unique.values():
            unique[name] = ids
    return {name: out[name] for name in unique}


# --- correlations --------------------------------------------------------------------------------------------
def rowwise_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row pair of ``x``, ``y`` [B, n] (ties ranked by their mean, as scipy does); NaN for a
    row with no spread."""
    from scipy.stats import rankdata

    rx = rankdata(x, axis=1)
    ry = rankdata(y, axis=1)
    rx -= rx.mean(1, keepdims=True)
    ry -= ry.mean(1, keepdims=True)
    den = np.sqrt((rx**2).sum(1) * (ry**2).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(1) / den, np.nan)


def spearman_interval(x, y, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict[str, Any]:
    """Spearman's rho of ``x`` against ``y`` over the cells (``scipy.stats.spearmanr``, with its p-value) and a
    percentile bootstrap 95% interval: the cells resampled with replacement ``n_boot`` times (resamples with no spread in either left
    out, and counted)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    test = spearmanr(x, y)
    picks = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))  # [B, n]
    boots = rowwise_spearman(x[picks], y[picks])
    kept = boots[np.isfinite(boots)]
    lo, hi = np.percentile(kept, [2.5, 97.5]) if len(kept) else (np.nan, np.nan)
    return {
        "rho": float(test.statistic),
        "p": float(test.pvalue),
        "lo": float(lo),
        "hi": float(hi),
        "n": len(x),
        "boot_dropped": int(n_boot - len(kept)),
    }


def within_tokenizers(cells: list[dict[str, Any]], q: str) -> dict[str, Any]:
    """Spearman's rho of ``q`` with success among the runs of one tokenizer (its seeds and settings), the mean over
    the tokenizers with at least 3 runs that have ``q`` (None when there is none): how well ``q`` ranks runs that
    the tokenizer alone cannot tell apart."""
    from scipy.stats import spearmanr

    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        if c.get(q) is not None:
            groups.setdefault(c["tokenizer"], []).append(c)
    rhos = [
        spearmanr([c[q] for c in g], [c["success_rate"] for c in g]).statistic for g in groups.values() if len(g) >= 3
    ]
    rhos = [float(r) for r in rhos if np.isfinite(r)]
    return {"within_rho": float(np.mean(rhos)) if rhos else None, "within_groups": len(rhos)}


def tokenizer_reference(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run with ``tokenizer_only``: the mean success of the other runs of its tokenizer in ``cells`` (None
    when it has none): what knowing the tokenizer, and how its other seeds did, predicts."""
    out = []
    for c in cells:
        others = [o["success_rate"] for o in cells if o["tokenizer"] == c["tokenizer"] and o is not c]
        out.append({**c, "tokenizer_only": float(np.mean(others)) if others else None})
    return out


def correlations(cells: list[dict[str, Any]], quantities: list[str]) -> list[dict[str, Any]]:
    """One row per (pool, quantity) with at least ``MIN_CELLS`` runs that have the quantity, and the reference of
    the tokenizer alone in a pool of several tokenizers."""
    rows = []
    for pool, members in pools(cells).items():
        several = len({c["tokenizer"] for c in members}) > 1
        members = tokenizer_reference(members)
        asked = [q for q in quantities if q != "tokenizer_only"]
        for q in [*asked, *(["tokenizer_only"] if several else [])]:
            have = [c for c in members if c.get(q) is not None]
            if len(have) < MIN_CELLS:
                continue
            r = spearman_interval([c[q] for c in have], [c["success_rate"] for c in have])
            good = predicts(r, EXPECTED[q]) and q not in REFERENCES
            within = within_tokenizers(have, q) if q != "tokenizer_only" else {"within_rho": None, "within_groups": 0}
            rows.append({"pool": pool, "quantity": q, **r, **within, "predicts": good})
    return rows


def predicts(r: dict[str, Any], sign: int) -> bool:
    """Whether a correlation makes a predictor: |rho| >= ``GOOD`` with the expected sign (0: either)."""
    return bool(np.isfinite(r["rho"]) and (sign * r["rho"] if sign else abs(r["rho"])) >= GOOD)


# --- measurements --------------------------------------------------------------------------------------------
def collapse(pred_first: np.ndarray, demo_first: np.ndarray, floor: float = SPREAD_FLOOR) -> dict[str, Any]:
    """The first predicted actions' spread against the recorded ones' at the same first frames, both [E, D]: the
    ratio of the standard deviations over episodes per dimension (None where the recorded spread is below
    ``floor``), and the smallest ratio (the most collapsed dimension)."""
    pred_sd = np.std(pred_first, axis=0, ddof=1)  # [D]
    demo_sd = np.std(demo_first, axis=0, ddof=1)  # [D]
    ratio = [float(p / d) if d >= floor else None for p, d in zip(pred_sd, demo_sd)]
    defined = [r for r in ratio if r is not None]
    return {"ratio_per_dim": ratio, "min": min(defined) if defined else None}


def action_rmse(pred: np.ndarray, target: np.ndarray, inside: np.ndarray) -> float:
    """RMSE in action units of chunks [N, T, D] over the steps ``inside`` [N, T], per dimension, then the mean over
    dimensions (``vla.heldout.errors``, raw)."""
    from vla.heldout import errors

    scale = np.ones(target.shape[-1])
    return float(np.mean(errors(pred, target, inside, scale)["rmse_raw_per_dim"]))


def episode_starts(heldout, info, config) -> Any:
    """``heldout`` with its chunks replaced by the ones at each of its episodes' first frames."""
    import torch
    from lerobot.utils.constants import ACTION

    from vla.data.torch_dataset import ActionChunkDataset

    image_keys = list(config.image_keys)
    ds = ActionChunkDataset(
        info,
        config.time_horizon,
        episodes=heldout.episodes,
        image_keys=image_keys,
        backend="lerobot" if image_keys else "memory",
        obs_steps=config.n_obs_steps,
        progress=False,
    )
    lengths = [int(info.episode_lengths[list(info.episode_index).index(e)]) for e in heldout.episodes]
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])  # [E] sample index of each episode's first frame
    batch = torch.utils.data.default_collate([ds[int(i)] for i in first])
    target = batch.pop(ACTION).double().numpy()  # [E, T, D]
    inside = ~batch.pop(f"{ACTION}_is_pad").numpy()  # [E, T]
    return replace(heldout, batch=batch, target=target, inside=inside)


def tokenizer_round_trip(policy, heldout) -> np.ndarray:
    """The held-out chunks [N, T, D] through the policy's own input steps up to the ids, then its output steps:
    what the tokenizer alone keeps of them, in action units."""
    import torch
    from lerobot.utils.constants import ACTION

    from vla.policy.pipeline import ACTION_IDS, TokenizeActions, run

    steps = policy.pipeline.measuring
    upto = next(i for i, s in enumerate(steps) if isinstance(s, TokenizeActions)) + 1
    batch = {**heldout.batch, ACTION: torch.as_tensor(heldout.target)}
    ids = run(steps[:upto], batch)[ACTION_IDS]
    out = run(policy.pipeline.outputs, {**heldout.batch, ACTION_IDS: ids})
    return np.asarray(out[ACTION], dtype=np.float64)


def measure(policy, heldout, starts) -> dict[str, Any]:
    """The measured quantities of one policy on the held-out chunks and the episodes' first frames."""
    policy.eval()
    chunks, valid, tokens = heldout.decode(policy)  # [N, T, D]
    forced = heldout.teacher_forced(policy)
    first, _, _ = starts.decode(policy)  # [E, T, D]
    spread = collapse(first[:, 0], starts.target[:, 0])
    inside = heldout.inside
    return {
        "first_action_rmse": action_rmse(chunks[:, :1], heldout.target[:, :1], inside[:, :1]),
        "chunk_rmse": action_rmse(chunks, heldout.target, inside),
        "accuracy": forced["accuracy"],
        "heldout_loss": forced["loss"],
        "collapse": spread["min"],
        "collapse_per_dim": spread["ratio_per_dim"],
        "tokens_per_chunk": tokens,
        "valid_rate": float(valid.mean()),
        "tokenizer_rmse": action_rmse(tokenizer_round_trip(policy, heldout), heldout.target, inside),
        "chunks": len(heldout),
        "episodes": len(starts),
    }


class HeldoutData:
    """The held-out chunks and first frames of one dataset, built once per policy shape (horizon, cameras)."""

    def __init__(self, root: Path, n_chunks: int):
        from vla.data.reader import dataset_info

        self.root, self.n_chunks = root, n_chunks
        self.info = dataset_info(root)
        self.episodes = [int(e) for e in self.info.episode_index]
        self.built: dict[tuple, tuple[Any, Any]] = {}

    def for_policy(self, config) -> tuple[Any, Any]:
        from vla.heldout import Heldout

        shape = (config.time_horizon, tuple(config.image_keys), config.n_obs_steps)
        if shape not in self.built:
            # the normalised unit is unused here (errors are in action units): the held-out episodes' own frames
            heldout = Heldout.build(self.info, self.episodes, self.episodes, config, self.n_chunks)
            self.built[shape] = (heldout, episode_starts(heldout, self.info, config))
        return self.built[shape]


def on_disk(cells: list[dict[str, Any]], work: Path) -> list[tuple[dict[str, Any], Path]]:
    """The runs whose policy is still in ``work/<study>/<id>/train/policy``."""
    found = []
    for c in cells:
        for study in (c["study"], *c["also_in"]):
            path = StudyRunFolder(work / study / c["id"]).train.policy
            if (path / "config.json").is_file():
                found.append((c, path))
                break
    return found


def measure_all(found, data: dict[str, HeldoutData], done: dict[str, dict], on_row) -> dict[str, dict]:
    """``{policy folder: measurements}`` for every run in ``found``; those in ``done`` (measured before on the
    same held-out data) kept. ``on_row`` receives all rows after each new one."""
    import torch
    from tqdm.auto import tqdm

    from vla.policy.modeling_vla import VLAPolicy

    rows = dict(done)
    for c, path in tqdm(found, desc="measuring policies", unit="policy"):
        source = data[c["dataset"]]
        if str(path) in rows and rows[str(path)].get("heldout") == str(source.root):
            continue
        torch.manual_seed(0)
        policy = VLAPolicy.from_pretrained(str(path))
        heldout, starts = source.for_policy(policy.config)
        rows[str(path)] = {"heldout": str(source.root), **measure(policy, heldout, starts)}
        on_row(rows)
    return rows


def attach(cells: list[dict[str, Any]], found, rows: dict[str, dict]) -> list[dict[str, Any]]:
    """The runs that were measured, each with its measurements (its own training-time quantities kept)."""
    out = []
    for c, path in found:
        if str(path) in rows:
            m = rows[str(path)]
            out.append({**c, **{k: m[k] for k in EXPECTED if k in m and k not in RUN_QUANTITIES}, "policy": str(path)})
    return out


# --- outputs -------------------------------------------------------------------------------------------------
def fmt(v: float) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:+.2f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| pool | quantity | rho | 95% interval | p | cells | within tokenizers (groups) | predicts (rho >= 0.8, "
        "expected sign) |"
    ]
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        interval = f"[{fmt(r['lo'])}, {fmt(r['hi'])}]"
        verdict = "reference" if r["quantity"] in REFERENCES else "**yes**" if r["predicts"] else "no"
        p = "n/a" if not np.isfinite(r["p"]) else f"{r['p']:.2g}"
        within = "n/a" if r["within_rho"] is None else f"{fmt(r['within_rho'])} ({r['within_groups']})"
        lines.append(
            f"| {r['pool']} | {r['quantity']} | {fmt(r['rho'])} | {interval} | {p} | {r['n']} | {within} | {verdict} |"
        )
    return lines


def cells_table(measured: list[dict[str, Any]]) -> list[str]:
    keys = ("first_action_rmse", "chunk_rmse", "accuracy", "collapse", "tokenizer_rmse", "tokens_per_chunk")
    lines = ["| run | success | final loss | " + " | ".join(k.replace("_", " ") for k in keys) + " |"]
    lines.append("| --- " * (3 + len(keys)) + "|")
    for c in sorted(measured, key=lambda c: -c["success_rate"]):
        values = " | ".join("n/a" if c.get(k) is None else f"{c[k]:.3g}" for k in keys)
        lines.append(f"| {c['study']}/{c['id']} | {c['success_rate']:.0%} | {c['final_loss']:.3f} | {values} |")
    return lines


def best(rows: list[dict[str, Any]], pool: str, k: int = 4) -> list[dict[str, Any]]:
    """The ``k`` quantities of ``pool`` with the largest rho in their expected direction (either: its size)."""
    mine = [r for r in rows if r["pool"] == pool and np.isfinite(r["rho"]) and r["quantity"] not in REFERENCES]
    return sorted(mine, key=lambda r: -(EXPECTED[r["quantity"]] * r["rho"] or abs(r["rho"])))[:k]


def plot(measured: list[dict[str, Any]], top: list[dict[str, Any]], path: Path, title: str) -> None:
    """Success against each of the ``top`` quantities, one panel each, a colour per tokenizer and a marker per
    observation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(len(top), 1), figsize=(3.6 * max(len(top), 1) + 0.9, 3.4), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    tokenizers = sorted({c["tokenizer"] for c in measured})
    markers = {"pixels": "o", "state": "^"}
    for ax, r in zip(axes[0], top):
        for c in measured:
            colour = colours[tokenizers.index(c["tokenizer"]) % len(colours)]
            ax.scatter(c[r["quantity"]], c["success_rate"], color=colour, marker=markers[c["observation"]], s=30)
        ax.set(xlabel=r["quantity"].replace("_", " "), ylabel="closed-loop success", ylim=(-0.03, 1.03))
        ax.set_title(f"rho {r['rho']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}], n={r['n']}", fontsize=9)
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], color=colours[i % len(colours)], marker="o", ls="", label=t)
        for i, t in enumerate(tokenizers)
    ]
    handles += [plt.Line2D([], [], color="grey", marker=m, ls="", label=o) for o, m in markers.items()]
    fig.legend(handles=handles, fontsize=7, loc="center right")
    fig.suptitle(f"{title}: closed-loop success against the best-ranked quantities", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / (3.6 * len(axes[0]) + 0.9), 1))
    save_figure(fig, path)


def plot_largest(measured: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> None:
    """``plot`` of the largest pool of measured runs and its four best-ranked quantities."""
    members = pools(measured)
    if not rows:
        return
    pool = max(dict.fromkeys(r["pool"] for r in rows), key=lambda p: len(members[p]))
    plot(members[pool], best(rows, pool, k=4), path, pool)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Which simulator-free quantities predict success in which pool (or that none does), how many correlations
    were tried, and the best of each pool."""
    tried = [r for r in rows if r["quantity"] not in REFERENCES and np.isfinite(r["rho"])]
    good = [r for r in tried if r["predicts"]]
    lines = [
        f"- {len(tried)} correlations of simulator-free quantities were taken (pools x quantities); at p < 0.05 about "
        f"{len(tried) / 20:.1f} would pass by chance alone."
    ]
    lines += [
        f"- **{r['quantity']}** reaches the bar in {r['pool']}: rho {fmt(r['rho'])} [{fmt(r['lo'])}, {fmt(r['hi'])}], "
        f"p {r['p']:.2g}, over {r['n']} runs"
        for r in good
    ]
    if not good:
        lines.append(f"- No simulator-free quantity reaches |rho| >= {GOOD} in its expected direction in any pool.")
    for pool in dict.fromkeys(r["pool"] for r in tried):
        r = best(tried, pool, k=1)[0]
        within = "" if r["within_rho"] is None else f"; within tokenizers {fmt(r['within_rho'])}"
        alone = [t for t in rows if t["pool"] == pool and t["quantity"] == "tokenizer_only"]
        alone_text = f"; the tokenizer alone {fmt(alone[0]['rho'])}" if alone else ""
        lines.append(
            f"- best in {pool} ({r['n']} runs): {r['quantity']}, rho {fmt(r['rho'])} [{fmt(r['lo'])}, "
            f"{fmt(r['hi'])}]{within}{alone_text}"
        )
    closed = [r for r in rows if r["quantity"] == "eval_tokens_per_chunk" and abs(r["rho"]) >= GOOD]
    lines += [
        f"- for reference, the ids per chunk decoded *in the closed loop* reach rho {fmt(r['rho'])} in {r['pool']} "
        f"({r['n']} runs): a consequence of what the policy did in the simulator, not a simulator-free predictor"
        for r in closed
    ]
    return lines


def measured_counts(measured: list[dict[str, Any]]) -> dict[str, int]:
    """How many measured runs of each task, observation and tokenizer."""
    out: dict[str, int] = {}
    for c in measured:
        key = f"{task_name(c['task'])} from {c['observation']} ({c['tokenizer']})"
        out[key] = out.get(key, 0) + 1
    return out


def markdown(record: dict[str, Any], args) -> str:
    measured, cells = record["measured_runs"], record["runs"]
    heldout = ", ".join(f"`{v}` (for the policies trained on `{k}`)" for k, v in record["heldout"].items())
    tasks = sorted({c["task"] for c in cells})
    lines = [
        "# A cheap predictor of closed-loop success (`scripts/predict_success.py`)",
        "",
        "Which quantity, measured without a simulator, ranks trained policies the way their closed-loop success "
        "does, across tokenizers, settings and training seeds? Each quantity's Spearman rank correlation with the "
        f"success rate over runs (cells), with a bootstrap 95% interval ({N_BOOT} resamples of the cells, seed "
        f"{BOOT_SEED}); a quantity *predicts* when |rho| >= {GOOD} with the expected sign (an error or a loss "
        f"falls as success rises). Pools with fewer than {MIN_CELLS} runs give no correlation. *Within tokenizers*: "
        "the same rank correlation among each tokenizer's own runs (its seeds and settings; tokenizers with 3 runs "
        "or more), the mean over them: whether the quantity ranks runs the tokenizer alone cannot tell apart. "
        "References, not candidates: `tokenizer_only`, the mean success of the other runs of the run's tokenizer "
        "in the pool (a quantity that only tells tokenizers apart reaches it and no more), and "
        "`eval_tokens_per_chunk`, the ids per chunk decoded during the closed-loop evaluation (it needs the "
        "simulator and mirrors what the policy did there).",
        "",
        "## Reproduce",
        "",
        "```bash",
        *record["record_commands"],
        "python scripts/predict_success.py",
        "```",
        "",
        f"## Measured on held-out episodes: {len(measured)} policies still on disk",
        "",
        f"Held-out data: {heldout}, recorded on layout seeds {record['seeds']['heldout']} (training recordings "
        f"used {record['seeds']['training']}, evaluations {record['seeds']['evaluation']}: disjoint). "
        f"{args.chunks} chunks evenly spaced through the episodes for the errors and ids; every episode's first "
        "frame for the collapse. Errors are RMSE in action units, the mean over the action dimensions.",
        "",
        *table(record["measured_correlations"]),
        "",
        *cells_table(measured),
        "",
        "![success against the best-ranked measured quantities](predictor.png)",
        "",
        f"## Training-time quantities over every traced run ({len(cells)} runs)",
        "",
        "Final loss (the training loss at the last step) and ids per chunk, from each study's `runs.json`; a training "
        "that two studies share counts once.",
        "",
        *table(record["training_correlations"]),
        "",
        "## What it says",
        "",
        *verdict(record["measured_correlations"] + record["training_correlations"]),
        "",
        "## Limits",
        "",
        f"- Held-out quantities exist only for the {len(measured)} runs whose policy is still on disk: "
        + "; ".join(f"{n} {pool}" for pool, n in measured_counts(measured).items())
        + ". A rank correlation over so few cells has a wide interval (the table's), and pooling the camera and "
        "state policies of one task mixes two settings whose success levels differ for reasons of their own.",
        f"- The training-time pools cover tasks {', '.join(tasks)}; a final loss is a mean over one batch's ids, "
        "and ids of different tokenizers are different targets, so across tokenizers it compares unlike things.",
        "- `tokenizer_rmse` is a property of a tokenizer fitted to the data, the same for every training seed here, so "
        "it can only rank tokenizers; `collapse` looks at 40 first frames per policy.",
        "- Each success rate is from 50-100 evaluation episodes: about +-5 to 10 points of binomial noise, "
        "which alone limits how well any quantity can rank runs whose success is close.",
    ]
    return "\n".join(lines) + "\n"


# --- the run ---------------------------------------------------------------------------------------------------
def recording(root: Path) -> dict[str, Any]:
    """What ``vla data record`` wrote about the dataset at ``root`` (refused for a dataset it did not record)."""
    found = read_recording(root)
    if found is None:
        raise SystemExit(f"{root} was not recorded by vla data record (no meta/recording.json): its seeds are unknown")
    return found


def seeds(cells: list[dict[str, Any]], heldout: dict[str, str]) -> dict[str, str]:
    """The layout seeds of the held-out recordings, of the runs' training recordings and of their evaluations, as
    ranges; raises SystemExit when a held-out seed is a training seed or falls in an evaluation's range."""
    held = {s for root in heldout.values() for s in recording(Path(root))["seeds"]}
    train = {s for root in {c["dataset"] for c in cells} for s in recording(Path(root))["seeds"]}
    spans = [c["eval_seeds"] for c in cells if c["eval_seeds"] is not None]
    clash = sorted(s for s in held if s in train or any(lo <= s <= hi for lo, hi in spans))
    if clash:
        raise SystemExit(f"held-out seeds {clash[:5]} are training or evaluation seeds; record on other seeds")
    evaluation = f"{min(lo for lo, _ in spans)}..{max(hi for _, hi in spans)}" if spans else "none"
    return {"heldout": f"{min(held)}..{max(held)}", "training": f"{min(train)}..{max(train)}", "evaluation": evaluation}


def record_commands(heldout: dict[str, str]) -> list[str]:
    """The ``vla data record`` commands that made the held-out datasets (from their ``meta/recording.json``)."""
    out = []
    for root in heldout.values():
        r = recording(Path(root))
        cmd = f"vla data record --task {r['task']} --episodes {r['episodes_per_task']} --seed {r['seed_start']}"
        if r.get("images"):
            observation = r.get("env_options", {}).get("observation", "privileged")
            cameras = " ".join(f"--camera {k}" for k in r["cameras"])
            cmd += f" --observation {observation} --images {cameras} --image-size {r['image_size']}"
        out.append(f"{cmd} --root {root}")
    return out


def earlier(path: Path) -> dict[str, dict]:
    """The measurements of an earlier ``predictor.json`` at ``path`` (none when there is none)."""
    return json.loads(path.read_text()).get("measurements", {}) if path.is_file() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results"), help="the folder of results/<study>/")
    parser.add_argument("--work", type=Path, default=Path("outputs/studies"), help="the studies' run folders")
    parser.add_argument(
        "--heldout",
        action="append",
        help="TRAINING_DATASET=HELDOUT_DATASET: held-out episodes for the policies trained on that dataset, recorded "
        "with its settings on other seeds (repeatable; default: the three below)",
    )
    parser.add_argument("--chunks", type=int, default=128, help="held-out chunks per policy")
    parser.add_argument("--out", type=Path, default=Path("results/predictor"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    heldout = dict(h.split("=", 1) for h in args.heldout or DEFAULT_HELDOUT)
    cells = read_runs(args.results, args.work)
    found = [(c, p) for c, p in on_disk(cells, args.work) if c["dataset"] in heldout]
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {"heldout": heldout}
    fixed = {
        "heldout": heldout,
        "seeds": seeds([c for c, _ in found], heldout),
        "record_commands": record_commands(heldout),
        "runs": [{k: v for k, v in c.items() if k != "key"} for c in cells],
        "training_correlations": correlations(cells, list(RUN_QUANTITIES)),
    }
    args.out.mkdir(parents=True, exist_ok=True)

    def write(rows: dict[str, dict]) -> None:  # after every policy: a stopped run keeps what it measured
        measured = attach(cells, found, rows)
        record = {
            **fixed,
            "measured_runs": [{k: v for k, v in c.items() if k != "key"} for c in measured],
            "measured_correlations": correlations(measured, list(EXPECTED)),
            "measurements": rows,
            "provenance": provenance(config=config, threads=args.threads),
        }
        write_json(args.out / "predictor.json", record)
        atomic_write_text(args.out / "README.md", markdown(record, args))
        plot_largest(measured, record["measured_correlations"], args.out / "predictor.png")

    data = {name: HeldoutData(Path(root), args.chunks) for name, root in heldout.items()}
    write(measure_all(found, data, earlier(args.out / "predictor.json"), on_row=write))
    print(f"wrote {args.out}/predictor.json, README.md and predictor.png")


DEFAULT_HELDOUT = (
    "outputs/datasets/metaworld_push-v3_pixels=outputs/datasets/metaworld_push-v3_pixels_heldout",
    "outputs/datasets/metaworld_push-v3=outputs/datasets/metaworld_push-v3_heldout",
    "outputs/datasets/metaworld_demo=outputs/datasets/metaworld_demo_heldout",
)

if __name__ == "__main__":
    main()
