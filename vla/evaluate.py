"""Closed-loop evaluation: run a trained policy in the simulator on evaluation seeds and report how it did.

    vla eval --policy outputs/train/debug/policy --env metaworld --task push-v3 --episodes 50 [--gif N]
    vla eval --policy outputs/train/mt10/policy --task mt10     # 50 episodes per task, a table per task

Any simulator of ``vla.sim`` (``--env FAMILY --task TASK``), one task or several (``--task mt10``, or
``--task drawer-open-v3,drawer-close-v3``); episodes of every task run in lockstep on ``--num-envs`` envs (at least
one per task) and their chunks are decoded as one batch.

Evaluation seeds start at ``EVAL_SEED_START``; recordings for training never use them. Reports the success
rate, mean return and episode length, latency per predicted chunk (mean, p95) and the share of chunks whose ids
decoded validly, as JSON (and an optional GIF of the first episodes when the policy uses a camera).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.utils.constants import OBS_STATE

from vla.execution import COMMITTED
from vla.io import atomic_write_text, save_figure, write_json
from vla.policy import VLAPolicy
from vla.policy.commit_search import REFUSES_COMMITTED
from vla.policy.saved_config import check_policy_folder
from vla.run_folder import EVAL_INFO, RunFolder
from vla.sim import EVAL_SEED_START, OBSERVATIONS, env_names, make_env
from vla.sim.rollout import run_episodes, summarize

MAX_DELAY_MS = 60_000.0  # a minute: beyond any network, and it keeps the step count small
LATENCY_SAMPLES = 20  # observations re-run one at a time after the rollouts, for the batch-of-one latency


class ChunkPolicy:
    """A ``VLAPolicy`` as the rollout helpers' batch callable ``[obs, ...] -> actions [B, T, D]``.

    Records the wall time of every call, the ids generated, whether each chunk decoded validly and how many of the
    observation's normalised state values the prompt clips to [-1, 1] (the observation outside the training range),
    and keeps the first ``LATENCY_SAMPLES`` observations so that ``single_latencies``
    can time them one at a time: a robot asks for one chunk at a time, and that latency is what ``evaluate``
    reports, whatever batch the rollouts used.
    """

    def __init__(self, policy: VLAPolicy):
        self.policy = policy.eval()
        self.batch_latencies_ms: list[float] = []
        self.valid: list[bool] = []
        self.tokens: list[int] = []
        self.state_clipped = 0
        self.samples: list[dict[str, Any]] = []

    @staticmethod
    def batch(observations: list[dict[str, Any]]) -> dict[str, Any]:
        keys = [k for k in observations[0] if k.startswith("observation.")]
        batch: dict[str, Any] = {k: torch.as_tensor(np.stack([np.asarray(o[k]) for o in observations])) for k in keys}
        batch["task"] = [o["task"] for o in observations]
        if any(COMMITTED in o for o in observations):  # per row, of its own length (none: nothing committed)
            batch[COMMITTED] = [np.asarray(o.get(COMMITTED, ()), dtype=np.float64) for o in observations]
        return batch

    def predict(self, observations: list[dict[str, Any]]) -> np.ndarray:
        with torch.inference_mode():
            chunks = self.policy.predict_action_chunk(self.batch(observations))  # [B, T, D] raw units
        return chunks.float().cpu().numpy()

    def __call__(self, observations: list[dict[str, Any]]) -> np.ndarray:
        self.samples.extend(observations[: LATENCY_SAMPLES - len(self.samples)])
        self.state_clipped += self.clipped(observations)
        start = time.perf_counter()
        chunks = self.predict(observations)
        self.batch_latencies_ms.append((time.perf_counter() - start) * 1000)
        info = self.policy.last_decode_info
        self.valid.extend(np.asarray(info["valid"]).tolist())
        self.tokens.extend(np.asarray(info["tokens_per_chunk"]).tolist())
        return chunks

    def clipped(self, observations: list[dict[str, Any]]) -> int:
        """How many of the observations' state values normalise outside [-1, 1] (the training data's q01..q99 by
        default), where the prompt clips them: once per observation, whatever decoding does with it."""
        normalizer = getattr(self.policy, "state_normalizer", None)
        if normalizer is None or any(OBS_STATE not in o for o in observations):
            return 0
        state = normalizer.normalize(np.stack([np.asarray(o[OBS_STATE], dtype=np.float64) for o in observations]))
        return int((np.abs(state) > 1.0).sum())

    def single_latencies(self, observations: list[dict[str, Any]] | None = None) -> np.ndarray:
        """Milliseconds per chunk for ``observations`` (default: the kept ones), one at a time, after one untimed
        warm-up call."""
        observations = self.samples if observations is None else observations
        if not observations:
            return np.zeros(0)
        self.predict(observations[:1])
        times = []
        for obs in observations:
            start = time.perf_counter()
            self.predict([obs])
            times.append((time.perf_counter() - start) * 1000)
        return np.asarray(times)


def decode_time(runner: ChunkPolicy, env: Any, seed: int, reps: int = 5, commit: bool = False) -> float:
    """Milliseconds the policy takes for one observation (the median of ``reps`` calls after a warm-up), on the
    observation ``env`` starts from on ``seed``: the decode part of a delayed reply. ``commit``: with a committed
    action sent along (the data's middle action), as every request but the first then is: a search decodes several
    chunks."""
    obs = env.reset(seed)
    if commit:
        policy = runner.policy
        obs = {**obs, COMMITTED: policy.action_normalizer.unnormalize(np.zeros((1, policy.config.action_dim)))}
    return float(np.median(runner.single_latencies([obs] * reps)))


def training_recording(policy_dir: str | Path) -> dict[str, Any]:
    """How the policy's training data was recorded (``meta/recording.json`` of the dataset in the run's
    ``train_config.json``), so that ``vla eval`` gives the policy the observation it was trained on, rendered at the
    size it was recorded at; empty when the run, its dataset or the recording cannot be found (a dataset moved, or
    not recorded by ``vla``)."""
    from vla.data.reader import read_recording

    try:
        root = RunFolder(Path(policy_dir).parent).train_config()["dataset_root"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    try:
        recording = read_recording(root)
    except (OSError, ValueError):
        recording = None
    if recording is None and not (Path(root) / "meta").is_dir():
        print(
            f"note: the training dataset {root} is not here (relative to {Path.cwd()}), so its observation "
            "convention is unknown; the simulator's default is used (pass --observation to choose)"
        )
    return recording or {}


def eval_provenance(policy_dir: Path | None, settings: dict[str, Any]) -> dict[str, Any]:
    """What produced an evaluation: its settings, the policy folder, and the training run's config and dataset
    (from the run's ``train_config.json``, when the policy came from one and its dataset is here)."""
    from vla.provenance import provenance

    train_config, dataset = None, None
    if policy_dir is not None:
        try:
            train_config = RunFolder(policy_dir.parent).train_config()
            root = Path(train_config["dataset_root"])
            dataset = root if (root / "meta").is_dir() else None
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return provenance(
        config={"eval": settings, "policy": str(policy_dir) if policy_dir else None, "train": train_config},
        dataset=dataset,
    )


def _check_state_dim(envs: list, state_dim: int | None, env_options: dict[str, Any] | None) -> None:
    """A policy reads the state it was trained on: a clear error before the first step when the env gives another."""
    given = envs[0].features.get(OBS_STATE, {}).get("shape", (None,))[0]
    if state_dim and given is not None and given != state_dim:  # state_dim 0: an image-only policy ignores it
        raise ValueError(
            f"the policy reads a {state_dim}-D state but {envs[0].name} gives {given} values (observation options "
            f"{env_options or 'default'}); pass the convention the training data was recorded with: --observation "
            "proprio (the robot's own body: Meta-World's 4-D hand and gripper, ALOHA's 14 joints) or privileged "
            "(with the object poses: Meta-World 39-D, ALOHA 21-D / 28-D)"
        )


def evaluate(
    policy: VLAPolicy | str | Path,
    env_name: str,
    episodes: int,
    *,
    seed_start: int = EVAL_SEED_START,
    n_action_steps: int | None = None,
    ensemble: float | None = None,
    num_beams: int | None = None,
    max_steps: int | None = None,
    num_envs: int = 10,
    gif_episodes: int = 0,
    env_options: dict[str, Any] | None = None,
    delay_ms: float | None = None,
    decode_ms: float | None = None,
    ahead: bool = False,
    every: int | str | None = None,
    commit: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Closed-loop episodes on seeds ``seed_start ..``, ``num_envs`` at a time (the policy decodes their chunks
    as one batch; results do not depend on ``num_envs`` beyond floating-point noise in the batched forward).
    ``n_action_steps``, ``ensemble`` (temporal ensembling's coefficient) and ``num_beams`` (beam search's hypotheses
    per chunk) default to the policy's.

    ``delay_ms`` (a network round trip) puts the policy behind a delay: each chunk reaches the robot ``delay_ms`` plus
    the decode time (``decode_ms``, measured on the first evaluation observation when not given) after the
    observation it answers, converted to control steps at the simulator's rate, while the simulator keeps stepping
    (``vla.execution.DelayedQueue``: the robot holds until the reply, or with ``ahead`` asks that many actions early;
    ``every`` steps (``"decode"``: the decode's), several replies on their way; ``commit`` sends the actions that
    will run meanwhile with each request). None is no delay at all; ``delay_ms=0, decode_ms=0`` gives the same."""
    _check_settings(episodes, num_envs, gif_episodes, out_dir, seed_start)
    _check_delay(delay_ms, decode_ms, ahead, every, commit)
    policy, policy_dir, recording, env_options = _loaded(policy, env_options)
    if commit and policy.commit_scheme is None:  # refused now, not at the first request
        raise ValueError(REFUSES_COMMITTED.format(name=policy.action_tokenizer.name))
    config = policy.config
    _check_for_policy(config, n_action_steps, num_beams, gif_episodes)
    if num_beams is not None:
        config.num_beams = num_beams
    if n_action_steps is None:  # an ensemble asked for here predicts every step unless told otherwise (ACT)
        n_action_steps = 1 if ensemble is not None and config.temporal_ensemble is None else config.n_action_steps
    ensemble = config.temporal_ensemble if ensemble is None else ensemble
    names = env_names(env_name)
    runner = ChunkPolicy(policy)
    # Task by task, seeds seed_start.. for each: episode k is task k // episodes (a GIF shows the first task's).
    episode_list = [(name, seed) for name in names for seed in range(seed_start, seed_start + episodes)]
    envs = _make_envs(policy, names, recording, num_envs, episodes, max_steps, env_options)
    delay = None
    if delay_ms is not None:
        decode_ms = decode_time(runner, envs[0], seed_start, commit=commit) if decode_ms is None else decode_ms
        delay = _delay(delay_ms, decode_ms, ahead, envs[0].fps, config.time_horizon, commit, every)
    frames: dict[int, list[np.ndarray]] = {}
    with _closing(envs), _bar(progress, len(episode_list), f"eval {env_name}") as bar:
        results = run_episodes(
            envs,
            runner,
            episode_list,
            n_action_steps=n_action_steps,
            ensemble=ensemble,
            obs_steps=config.n_obs_steps,
            delay_steps=delay["delay_steps"] if delay else 0,
            ahead=ahead,
            every=delay.get("every") if delay else None,
            commit=commit,
            on_step=_gif_frames(frames, gif_episodes, list(config.image_keys)),
            on_episode=(lambda r: bar.update(1)) if bar else None,
        )
    common = _decoding(runner, n_action_steps, ensemble, config.num_beams, len(envs)) | (delay or {})
    report = _report(results, names, env_name, episodes, seed_start, common)
    delayed = {} if delay_ms is None else dict(delay_ms=delay_ms, decode_ms=decode_ms, ahead=ahead, commit=commit)
    delayed |= {"every": every} if every is not None else {}
    run = dict(n_action_steps=n_action_steps, ensemble=ensemble, num_beams=config.num_beams, max_steps=max_steps)
    settings = dict(env=env_name, episodes=episodes, seed_start=seed_start, **run, num_envs=num_envs)
    report["provenance"] = eval_provenance(policy_dir, {**settings, "env_options": env_options, **delayed})
    if out_dir is not None:
        _write(Path(out_dir), report, frames, env_name)
    return report


def _check_for_policy(config, n_action_steps: int | None, num_beams: int | None, gif_episodes: int) -> None:
    """The settings that depend on the policy: the actions run per chunk, the beams, a GIF of its camera."""
    if n_action_steps is not None and not 1 <= n_action_steps <= config.time_horizon:
        raise ValueError(
            f"n_action_steps {n_action_steps} is outside the policy's chunk: use 1..{config.time_horizon} "
            f"(time_horizon), or leave it unset for the policy's {config.n_action_steps}"
        )
    if num_beams is not None:
        config.check_num_beams(num_beams)
    if gif_episodes and not config.image_keys:
        raise ValueError("--gif draws the policy's camera, and this policy has none (state only); drop --gif")


@contextlib.contextmanager
def _closing(envs: list):
    """The envs for the block, closed after it (their renderers released) whatever happens."""
    try:
        yield envs
    finally:
        for env in envs:
            env.close()


@contextlib.contextmanager
def _bar(show: bool, total: int, desc: str):
    """A progress bar over ``total`` episodes for the block (None when not ``show``)."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="ep")
    try:
        yield bar
    finally:
        bar.close()


def _check_settings(
    episodes: int,
    num_envs: int,
    gif_episodes: int,
    out_dir: str | Path | None,
    seed_start: int,
) -> None:
    """The settings that need no policy, checked before one is loaded."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(
            f"--out {out_dir} is a file; eval writes a folder (eval_info.json, rollouts.gif): pass a folder"
        )
    if seed_start < EVAL_SEED_START:
        raise ValueError(f"evaluation seeds start at {EVAL_SEED_START}; {seed_start} could overlap training seeds")


def _check_delay(
    delay_ms: float | None, decode_ms: float | None, ahead: bool, every: int | str | None, commit: bool
) -> None:
    """The delay's settings, checked before a policy is loaded."""
    for name, value in (("delay_ms", delay_ms), ("decode_ms", decode_ms)):
        if value is not None and not (np.isfinite(value) and 0 <= value <= MAX_DELAY_MS):
            raise ValueError(
                f"--{name.replace('_', '-')} must be a time in milliseconds in 0..{MAX_DELAY_MS}, got {value}"
            )
    if (decode_ms is not None or ahead) and delay_ms is None:
        raise ValueError("--decode-ms and --ahead model a delayed reply: give --delay-ms too (0 for decoding only)")
    if every is not None and not ahead:
        raise ValueError("--every asks ahead every K steps, several replies on their way: it needs --ahead")
    if every is not None and every != "decode" and not (isinstance(every, int) and every >= 1):
        raise ValueError(f"--every is a number of control steps >= 1 or 'decode', got {every!r}")
    if commit and not ahead:
        raise ValueError("--commit sends the actions that run while a reply is on its way: it needs --ahead")
    if commit and every is not None:
        raise ValueError(
            "--commit with --every: with several replies on their way, which actions run before a reply lands is not "
            "known when it is asked (a robot cannot know when each lands); use one or the other"
        )


def _loaded(
    policy: VLAPolicy | str | Path, env_options: dict[str, Any] | None
) -> tuple[VLAPolicy, Path | None, dict[str, Any], dict[str, Any] | None]:
    """The policy (loaded when given as a folder), its folder, how its training data was recorded, and the env
    options: as given, else the recording's (the observation convention the policy was trained on)."""
    if isinstance(policy, VLAPolicy):
        return policy, None, {}, env_options
    path = Path(policy)
    if not path.is_dir():
        raise ValueError(f"no policy at {path}; pass the folder a training run wrote (e.g. outputs/train/NAME/policy)")
    check_policy_folder(path)  # a training run's folder: names the policy inside it
    recording = training_recording(path)
    if env_options is None:
        env_options = dict(recording.get("env_options") or {}) or None
    return VLAPolicy.from_pretrained(path), path, recording, env_options


def _make_envs(
    policy: VLAPolicy,
    names: list[str],
    recording: dict[str, Any],
    num_envs: int,
    episodes: int,
    max_steps: int | None,
    env_options: dict[str, Any] | None,
) -> list:
    """``num_envs`` envs (at least one per task), rendering the policy's cameras at the size the training frames were
    recorded at (the policy's pipeline resizes, as in training), else at the policy's; LeRobot's convention renders
    at its own size."""
    config = policy.config
    size = recording.get("image_size") or config.image_size or policy.model.image_size
    if (env_options or {}).get("observation") == "lerobot":
        size = None
    per_task = max(1, min(num_envs // len(names), episodes))
    envs = [
        make_env(name, image_keys=list(config.image_keys), image_size=size, max_steps=max_steps, **(env_options or {}))
        for name in names
        for _ in range(per_task)
    ]
    _check_state_dim(envs, config.state_dim, env_options)
    return envs


def _delay(
    delay_ms: float,
    decode_ms: float,
    ahead: bool,
    fps: int,
    time_horizon: int,
    commit: bool = False,
    every: int | str | None = None,
) -> dict[str, Any]:
    """The report's delay fields: the round trip and decode in milliseconds, the control steps they last at ``fps``
    and when the next chunk is asked for (``every``: a number of steps, ``"decode"`` resolved to the decode's)."""
    delay_steps = math.ceil((delay_ms + decode_ms) * fps / 1000 - 1e-9)
    if every == "decode":
        every = max(1, math.ceil(decode_ms * fps / 1000 - 1e-9))
    if every is not None and delay_steps + every > time_horizon:
        print(
            f"WARNING: asked every {every} steps, a reply must cover its {delay_steps} steps on the way plus {every}, "
            f"but a chunk holds {time_horizon} actions: the robot holds at the end of each chunk; ask more often "
            "(a smaller --every), or use a policy with longer chunks"
        )
    elif ahead and every is None and delay_steps >= time_horizon:
        print(
            f"WARNING: a reply arrives {delay_steps} control steps after its observation, but a chunk holds "
            f"{time_horizon} actions: with --ahead every reply is stale when it lands and the robot holds "
            "after its first chunk; use a policy with longer chunks, or evaluate without --ahead"
        )
    request = ("ahead, with the committed actions" if commit else "ahead") if ahead else "when empty"
    if every is not None:
        request += f", every {every} step" + ("s" if every != 1 else "")
    out = dict(delay_ms=delay_ms, decode_ms=decode_ms, delay_steps=delay_steps, request=request)
    return out if every is None else {**out, "every": every}


def _gif_frames(frames: dict[int, list[np.ndarray]], gif_episodes: int, image_keys: list[str]):
    """The rollout's ``on_step`` that keeps the first camera's frames of the first ``gif_episodes`` episodes in
    ``frames`` (None when no GIF is asked for: the rollout then draws only the frames the policy is shown)."""
    if not (gif_episodes > 0 and image_keys):
        return None

    def on_step(k: int, obs: dict[str, Any], action: np.ndarray) -> None:
        if k < gif_episodes:
            image = obs[image_keys[0]]  # [3, H, W] in [0, 1]
            frames.setdefault(k, []).append((np.asarray(image).transpose(1, 2, 0) * 255).round().astype(np.uint8))

    return on_step


def _decoding(runner: ChunkPolicy, n_action_steps: int, ensemble: float | None, num_beams: int, num_envs: int):
    """The report's fields on how the chunks were decoded and executed, and how long one took."""
    single = runner.single_latencies()
    batch_lat = np.asarray(runner.batch_latencies_ms)
    return dict(
        n_action_steps=n_action_steps,
        temporal_ensemble=ensemble,
        num_beams=num_beams,
        num_envs=num_envs,
        chunks=len(runner.valid),
        latency_ms_mean=float(single.mean()),  # one observation at a time: what a robot waits for
        latency_ms_p95=float(np.percentile(single, 95)),
        batch_latency_ms_mean=float(batch_lat.mean()),  # one call over up to num_envs observations
        valid_chunk_rate=float(np.mean(runner.valid)) if runner.valid else 1.0,
        tokens_per_chunk=float(np.mean(runner.tokens)) if runner.tokens else 0.0,
        state_clipped_per_chunk=runner.state_clipped / len(runner.valid) if runner.valid else 0.0,
    )


def _report(results: list, names: list[str], env_name: str, episodes: int, seed_start: int, common: dict) -> dict:
    """The evaluation report: the summary of the episodes (with one per task when there are several) and ``common``."""
    if len(names) == 1:
        return {**summarize(results), "env": env_name, "seed_start": seed_start, **common}
    tasks = {
        name: {**summarize([r for r in results if r.env == name]), "env": name, "seed_start": seed_start}
        for name in names
    }
    rates = [t["success_rate"] for t in tasks.values()]
    return {
        "env": env_name,
        "episodes": len(results),
        "episodes_per_task": episodes,
        "success_rate": float(np.mean(rates)),  # the average over tasks (each has the same episodes)
        "min_task_success_rate": float(np.min(rates)),
        "mean_return": float(np.mean([r.ret for r in results])),
        "mean_length": float(np.mean([r.length for r in results])),
        "seed_start": seed_start,
        **{k: v for k, v in summarize(results).items() if k.endswith("_mean") and k != "mean_return"},
        **common,
        "tasks": tasks,
    }


def _write(out_dir: Path, report: dict[str, Any], frames: dict[int, list[np.ndarray]], env_name: str) -> None:
    """``eval_info.json`` (and per task ``eval_tasks.md`` / ``.png``; the GIF ``rollouts.gif``) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / EVAL_INFO, report)
    if "tasks" in report:
        rates = {"success": task_rates(report)}
        atomic_write_text(out_dir / "eval_tasks.md", task_table(rates))
        plot_tasks(rates, out_dir / "eval_tasks.png", title=env_name)
    if frames:
        import imageio.v2 as imageio

        ordered = [f for k in sorted(frames) for f in frames[k]]
        imageio.mimsave(out_dir / "rollouts.gif", ordered[::2], duration=1 / 40)


def task_rates(report: dict[str, Any]) -> dict[str, float]:
    """Success rate per task of an ``evaluate`` report (one entry for a single-task report), by short task name."""
    tasks = report.get("tasks") or {report["env"]: report}
    return {name.split("/")[-1]: t["success_rate"] for name, t in tasks.items()}


def task_table(rates: dict[str, dict[str, float]]) -> str:
    """A markdown table of ``{column: {task: success rate}}`` (a column per tokenizer, say): a row per task, then the
    average."""
    names = list(rates)
    tasks = list(rates[names[0]])
    lines = ["| task | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for task in tasks:
        lines.append(f"| {task} | " + " | ".join(f"{rates[n].get(task, float('nan')):.0%}" for n in names) + " |")
    lines.append("| **average** | " + " | ".join(f"**{np.mean(list(rates[n].values())):.0%}**" for n in names) + " |")
    return "\n".join(lines) + "\n"


def plot_tasks(rates: dict[str, dict[str, float]], path: Path, title: str = "") -> None:
    """A grouped bar chart of ``{name: {task: success rate}}``: success per task, one bar per name (tokenizer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(next(iter(rates.values())))
    width = 0.8 / len(rates)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(tasks) + 2), 3.6))
    for i, (name, by_task) in enumerate(rates.items()):
        xs = np.arange(len(tasks)) + (i - (len(rates) - 1) / 2) * width
        ax.bar(
            xs, [by_task.get(t, 0.0) for t in tasks], width, label=f"{name} (avg {np.mean(list(by_task.values())):.0%})"
        )
    ax.set_xticks(np.arange(len(tasks)), [t.removesuffix("-v3") for t in tasks], rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("eval", help="closed-loop evaluation of a trained policy", description=__doc__)
    p.add_argument("--policy", type=Path, required=True, help="a policy folder (outputs/train/NAME/policy)")
    p.add_argument("--env", default="metaworld", help="simulator family (default: %(default)s)")
    p.add_argument(
        "--task",
        default="push-v3",
        help="the family's task, several (drawer-open-v3,drawer-close-v3) or a set (mt10) (default: %(default)s)",
    )
    p.add_argument("--episodes", type=int, default=50, help="evaluation episodes per task (default: %(default)s)")
    p.add_argument("--seed-start", type=int, default=EVAL_SEED_START)
    p.add_argument("--n-action-steps", type=int, default=None, help="actions run per chunk (default: the policy's)")
    p.add_argument(
        "--temporal-ensemble",
        type=float,
        default=None,
        metavar="COEFF",
        help="ACT's temporal ensembling: predict a chunk every --n-action-steps (default 1) and run the "
        "weighted mean of the chunks covering each step, weights exp(-COEFF * i), oldest first (ACT: 0.01; "
        "default: the policy's temporal_ensemble, none); behind --delay-ms with --ahead --every K, each landing reply "
        "is blended with the chunks still running",
    )
    p.add_argument(
        "--num-beams",
        type=int,
        default=None,
        metavar="K",
        help="decode each chunk by beam search over K hypotheses, the most probable chunk instead of "
        "greedy's id-by-id choice (default: the policy's num_beams, 1)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the simulator's)")
    p.add_argument("--num-envs", type=int, default=10, help="episodes run at once, their chunks decoded as one batch")
    p.add_argument(
        "--observation",
        choices=OBSERVATIONS,
        default=None,
        help="the observation convention the policy was trained on (vla data record --observation; default: "
        "the one in its training data's meta/recording.json, else privileged)",
    )
    p.add_argument(
        "--delay-ms",
        type=float,
        default=None,
        metavar="MS",
        help="put the policy behind a network: each chunk arrives MS of round trip plus the decode time "
        "after the observation it answers, the simulator stepping meanwhile (default: no delay)",
    )
    p.add_argument(
        "--decode-ms",
        type=float,
        default=None,
        metavar="MS",
        help="with --delay-ms: the decode time to add (default: measured on the first observation)",
    )
    p.add_argument(
        "--ahead",
        action="store_true",
        help="with --delay-ms: ask for the next chunk as many actions early as the delay lasts, skipping "
        "the reply's actions for the steps that ran meanwhile (default: ask when the chunk runs out, hold)",
    )
    p.add_argument(
        "--every",
        type=_every,
        default=None,
        metavar="K",
        help="with --ahead: ask every K control steps, several replies on their way, so that a chunk needs the "
        "delay plus K actions rather than twice the delay; 'decode': every decode time's worth of steps, as often as "
        "a server decoding one request at a time keeps up with (default: one reply on its way at a time)",
    )
    p.add_argument(
        "--commit",
        action="store_true",
        help="with --ahead: send the actions that will run while the reply is on its way with each request, and "
        "decode the new chunk after them (committed-prefix decoding; time-local tokenizers: bin)",
    )
    p.add_argument("--gif", type=int, default=0, help="save a GIF of this many episodes (policies with a camera)")
    p.add_argument("--out", type=Path, default=None, help="folder for eval_info.json (default: beside the policy)")
    p.set_defaults(func=_run)


def _every(text: str) -> int | str:
    """``--every``: a number of control steps >= 1, or ``decode``."""
    if text == "decode":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a number of control steps >= 1, or 'decode'; got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    out = args.out or args.policy.parent / f"eval_{args.task.replace(',', '+')}"
    report = evaluate(
        args.policy,
        f"{args.env}/{args.task}",
        args.episodes,
        seed_start=args.seed_start,
        n_action_steps=args.n_action_steps,
        ensemble=args.temporal_ensemble,
        num_beams=args.num_beams,
        max_steps=args.max_steps,
        num_envs=args.num_envs,
        gif_episodes=args.gif,
        env_options={"observation": args.observation} if args.observation else None,
        delay_ms=args.delay_ms,
        decode_ms=args.decode_ms,
        ahead=args.ahead,
        every=args.every,
        commit=args.commit,
        out_dir=out,
    )
    if "tasks" in report:
        print(task_table({"success": task_rates(report)}), end="")
    print(
        f"{args.task}: success {report['success_rate']:.1%} over {report['episodes']} episodes, "
        f"return {report['mean_return']:.1f}, latency {report['latency_ms_mean']:.0f} ms/chunk "
        f"(p95 {report['latency_ms_p95']:.0f}), valid chunks {report['valid_chunk_rate']:.1%}; wrote {out}"
    )
    if report["state_clipped_per_chunk"]:
        print(
            f"the state left the training range: {report['state_clipped_per_chunk']:.2f} normalised state values a "
            "chunk were clipped to [-1, 1] (the data's q01..q99); check the observation matches the training data's"
        )
    if "delay_steps" in report:
        print(
            f"delay: {report['delay_ms']:.0f} ms round trip + {report['decode_ms']:.1f} ms decode = "
            f"{report['delay_steps']} control steps, request {report['request']}; the robot held "
            f"{report['held_steps_mean']:.1f} steps an episode, jump at the hand-over {report['switch_jump_mean']:.3f} "
            f"(within chunks {report['step_change_mean']:.3f})"
        )
    return 0
