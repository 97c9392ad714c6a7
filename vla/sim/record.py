"""Record scripted-expert demonstrations from any simulator (``vla.sim``) into a LeRobot v3.0 dataset, atomically.

    summary = record("metaworld/push-v3", episodes=100, root="outputs/datasets/metaworld_push-v3")

Each attempt runs the task's expert on a fresh seed (``seed, seed + 1, ...``); successful episodes are
kept (all of them with ``keep_failed=True``, each flagged in ``meta/recording.json``) until ``episodes``
are recorded. The dataset holds per step what the env's ``features`` say (for Meta-World: ``observation.state`` float32 [39],
``action`` float32 [4], and with ``images=True`` each camera), and the task sentence; ``meta/recording.json`` says how
it was made: task, expert success rate, the seed of every episode, the action noise, the image format, versions.

Cameras are stored as LeRobot stores them by default (``image_format="video"``): video features, encoded by LeRobot's
own writer with its default encoder (AV1 by libsvtav1, yuv420p, CRF 30, a keyframe every 2 frames), so lossy: on
64 px Meta-World frames a decoded value is off by 3.6-4.1 of 255 on average (PSNR ~30 dB, mostly the halved colour
resolution at edges; tests/test_video.py bounds it), in an eighth of the bytes. ``image_format="png"`` keeps the exact
frames instead (PNG inside the parquet rows, LeRobot's ``image`` dtype).

``action_noise=sigma`` perturbs the expert the DART way (Laskey et al., 2017): each action the env executes is the
expert's plus Gaussian noise (std ``sigma`` per dimension, clipped to [-1, 1]), while the dataset stores the
expert's own action for that state. The episodes then visit states just off the expert's path, labelled with how
the expert gets back, which is what a cloned policy needs once its own small errors move it there (a missed grasp,
an approach a centimetre off). The noise comes from a generator seeded by the episode's seed: a recording is
reproducible, episode by episode.

The dataset is written to a hidden sibling folder and renamed into place at the end, so a failed or
interrupted recording leaves no dataset that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data.reader import RECORDING_FILE, RECORDING_FORMAT, read_recording
from vla.io import atomic_directory, write_json
from vla.sim import EVAL_SEED_START, TRAIN_SEED_START, Env, Expert, env_names, make_env, make_expert, split_name
from vla.sim.rollout import EpisodeResult, run_episode, summarize

DEFAULT_ENV = "metaworld/push-v3"
DEFAULT_EPISODES = 100
DEFAULT_ACTION_NOISE = 0.0  # the default dataset's DART noise (see the module docstring)
DEFAULT_IMAGE_SIZE = 128
IMAGE_FORMATS = ("video", "png")  # how cameras are stored: LeRobot's video features (its default), or exact PNG frames
DEFAULT_IMAGE_FORMAT = "video"
# The dataset `vla demo` trains on (relative to the working directory).
DEFAULT_DATASET_ROOT = Path("outputs/datasets/metaworld_push-v3")


def default_root(env_name: str = DEFAULT_ENV, images: bool = False) -> Path:
    """Where ``vla data record`` writes when no ``--root`` is given: ``outputs/datasets/<family>_<task>[_images]``."""
    return Path("outputs/datasets") / f"{env_name.replace('/', '_')}{'_images' if images else ''}"


def max_attempts_for(episodes: int) -> int:
    """How many seeds a recording may spend to collect ``episodes`` successes (experts succeed ~98%)."""
    return 3 * episodes + 10


def record(
    env_name: str = DEFAULT_ENV,
    episodes: int = DEFAULT_EPISODES,
    root: str | Path | None = None,
    *,
    images: bool = False,
    cameras: list[str] | None = None,
    image_size: int | None = None,
    image_format: str = DEFAULT_IMAGE_FORMAT,
    seed: int = TRAIN_SEED_START,
    max_steps: int | None = None,
    keep_failed: bool = False,
    action_noise: float = 0.0,
    env_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Record ``episodes`` expert episodes per task of ``env_name`` into a new LeRobot dataset at ``root``.

    ``env_name`` is one environment (``metaworld/push-v3``) or several (a task set, ``metaworld/mt10``, or a comma
    list, ``metaworld/drawer-open-v3,drawer-close-v3``): one dataset then holds every task's episodes, each with its
    own instruction as its LeRobot task, and every task draws its layouts from the same seeds ``seed, seed + 1, ...``.
    ``images=True`` records ``cameras`` (dataset keys; default the family's ``default_cameras``) at ``image_size`` pixels
    (default: the simulator's, ``DEFAULT_IMAGE_SIZE`` for Meta-World's own convention), stored as ``image_format``
    (``"video"``, LeRobot's default, or ``"png"``: exact frames; see the module docstring); ``env_options`` go to
    the simulator (Meta-World: ``{"observation": "lerobot"}``).
    Returns a summary: ``root``, ``episodes`` (in all), ``attempts``, ``expert_success_rate``, ``frames``,
    ``episode_lengths``, ``seeds``, ``seconds``, ``steps_per_s``, the settings and ``tasks`` (one summary per task).
    Raises ValueError for bad arguments (unknown task, existing root without ``overwrite``, seeds reaching the
    evaluation range) and when an expert cannot collect ``episodes`` successes within ``max_attempts_for(episodes)``
    seeds.
    """
    names = env_names(env_name)  # a clear error for an unknown family or task, before anything is written
    fam, _ = split_name(names[0])
    root = Path(root) if root is not None else default_root(env_name, images)
    attempts_allowed = episodes if keep_failed else max_attempts_for(episodes)
    _check_settings(fam, root, episodes, action_noise, seed, attempts_allowed, image_format, overwrite)
    image_keys = list(cameras or fam.default_cameras) if images else []
    if images and not image_keys:
        raise ValueError(
            f"the {fam.name} simulator has no camera to record; drop --images (its episodes are state only)"
        )

    def env_for(name: str) -> Env:
        return make_env(name, image_keys=image_keys, image_size=image_size, max_steps=max_steps, **(env_options or {}))

    # Everything goes into a hidden sibling renamed into place at the end (also on Ctrl-C nothing half-written
    # stays): readers never see half a dataset, and an existing dataset (overwrite) goes only after that.
    with atomic_directory(root) as tmp:
        tmp.rmdir()  # LeRobot creates the dataset folder itself
        summary = _record_into(
            tmp,
            spec=env_name,
            names=names,
            env_for=env_for,
            video=image_format == "video" and bool(image_keys),
            expert_for=lambda name: NoisyExpert(make_expert(name), action_noise),
            episodes=episodes,
            seed=seed,
            keep_failed=keep_failed,
            attempts_allowed=attempts_allowed,
            progress=progress,
        )
        summary.update(
            action_noise=float(action_noise),
            env_options=dict(env_options or {}),
            image_format=image_format if image_keys else None,
        )
        _write_recording_json(tmp, summary)
    summary["root"] = str(root)
    return summary


def _check_settings(
    fam,
    root: Path,
    episodes: int,
    action_noise: float,
    seed: int,
    attempts_allowed: int,
    image_format: str,
    overwrite: bool,
) -> None:
    """``record``'s settings, checked before anything is written."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if not (np.isfinite(action_noise) and 0.0 <= action_noise <= 1.0):
        raise ValueError(f"action_noise is a standard deviation in action units, 0 to 1; got {action_noise}")
    if action_noise > 0 and not fam.closed_loop_expert:
        raise ValueError(
            f"{fam.name}'s expert is planned at reset and replayed open loop: DART noise "
            "(--action-noise) would push it off its plan with nothing to correct it; use 0"
        )
    if seed < 0 or seed + attempts_allowed > EVAL_SEED_START:
        raise ValueError(
            f"recording may use seeds {seed}..{seed + attempts_allowed - 1}, but seeds from "
            f"{EVAL_SEED_START} are kept for evaluation; choose a seed in 0..{EVAL_SEED_START - attempts_allowed}"
        )
    if image_format not in IMAGE_FORMATS:
        raise ValueError(
            f"image_format must be one of {', '.join(IMAGE_FORMATS)} (video: LeRobot's default, lossy; "
            f"png: exact frames), got {image_format!r}"
        )
    if root.exists() and not overwrite:
        raise ValueError(f"{root} already exists; choose another --root or pass --overwrite to replace it")
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} exists and is not a folder")


def _record_into(
    out: Path,
    *,
    spec: str,
    names: list[str],
    env_for: Callable[[str], Env],
    video: bool,
    expert_for: Callable[[str], NoisyExpert],
    episodes: int,
    seed: int,
    keep_failed: bool,
    attempts_allowed: int,
    progress: bool,
) -> dict[str, Any]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # slow import: only when recording
    from lerobot.utils.utils import SuppressProgressBars
    from tqdm import tqdm

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration per episode otherwise: errors only
    started = time.perf_counter()
    per_task: list[dict[str, Any]] = []
    all_kept: list[EpisodeResult] = []
    all_tried: list[EpisodeResult] = []
    first = None
    # Unwound last-in first-out on success and on any error: bar, dataset (finalize writes the parquet
    # footers, needed even when the folder is about to be deleted), progress bars, envs.
    with contextlib.ExitStack() as stack:
        stack.enter_context(SuppressProgressBars())  # the `datasets` library draws a bar per saved episode
        dataset = None
        bar = stack.enter_context(
            tqdm(total=episodes * len(names), desc=f"record {spec}", unit="ep", disable=not progress)
        )
        for name in names:
            env = env_for(name)
            with contextlib.closing(env):
                if first is None:
                    first = env
                    dataset = LeRobotDataset.create(
                        repo_id=f"local/{spec.replace('/', '_').replace(',', '+')}",
                        fps=env.fps,
                        features=stored_features(env.features, video),
                        root=out,
                        robot_type=env.robot_type,
                        use_videos=video,  # encoded by LeRobot's writer with its default encoder, per episode
                        video_backend="pyav",  # naming one skips LeRobot's noisy torchcodec probe
                        # PNGs are written in this thread: a writer thread measured no faster on 2 cores
                    )
                    stack.callback(dataset.finalize)
                elif (env.features, env.fps, env.robot_type) != (first.features, first.fps, first.robot_type):
                    raise ValueError(f"{name} records other features than {first.name}; record them into two datasets")
                kept, tried = _record_task(
                    dataset, env, expert_for(name), episodes, seed, keep_failed, attempts_allowed, bar
                )
            all_kept += kept
            all_tried += tried
            per_task.append(_task_summary(env, kept, tried))
    _remove_empty_dirs(out / "images")  # LeRobot's scratch folder for PNG frames, empty once embedded or encoded

    return _summary(spec, names, first, episodes, seed, keep_failed, per_task, all_kept, all_tried, started)


def _summary(
    spec: str,
    names: list[str],
    first: Env,
    episodes: int,
    seed: int,
    keep_failed: bool,
    per_task: list[dict],
    all_kept: list[EpisodeResult],
    all_tried: list[EpisodeResult],
    started: float,
) -> dict[str, Any]:
    """What a recording says about itself (``meta/recording.json``)."""
    seconds = time.perf_counter() - started
    cameras = [k for k, ft in first.features.items() if ft["dtype"] == "image"]
    family, task = spec.split("/")
    return {
        "env": family,
        "task": task,  # the spec's task part: "push-v3", "mt10", "drawer-open-v3,drawer-close-v3"
        "task_text": first.task_text if len(names) == 1 else None,
        "episodes_per_task": episodes,
        "episodes": len(all_kept),
        "frames": int(sum(r.length for r in all_kept)),
        "attempts": len(all_tried),
        "expert_success_rate": summarize(all_tried)["success_rate"],
        "episode_lengths": [r.length for r in all_kept],
        "episode_success": [r.success for r in all_kept],
        "seeds": [r.seed for r in all_kept],
        "failed_seeds": [r.seed for r in all_tried if not r.success],
        "seed_start": seed,
        "keep_failed": keep_failed,
        "images": bool(cameras),
        "image_size": first.features[cameras[0]]["shape"][0] if cameras else None,
        "cameras": cameras,
        "fps": first.fps,
        "max_steps": first.max_steps,
        "tasks": per_task,
        "seconds": round(seconds, 3),
        "steps_per_s": round(sum(r.length for r in all_tried) / max(seconds, 1e-9), 1),
    }


def stored_features(features: dict[str, dict], video: bool) -> dict[str, dict]:
    """An env's features as the dataset stores them: its cameras (``"image"``) as ``"video"`` when ``video``."""
    if not video:
        return features
    return {k: {**ft, "dtype": "video"} if ft["dtype"] == "image" else ft for k, ft in features.items()}


def _record_task(
    dataset, env: Env, expert: NoisyExpert, episodes: int, seed: int, keep_failed: bool, attempts_allowed: int, bar
) -> tuple[list[EpisodeResult], list[EpisodeResult]]:
    """``episodes`` episodes of one task into ``dataset`` (its instruction as each frame's task)."""
    kept: list[EpisodeResult] = []
    tried: list[EpisodeResult] = []
    cameras = [k for k, ft in env.features.items() if ft["dtype"] == "image"]

    def add_frame(obs: dict[str, Any], action: np.ndarray) -> None:
        frame = {
            OBS_STATE: obs[OBS_STATE],
            ACTION: expert.label,  # the expert's own action (the executed one when there is no noise)
            "task": obs["task"],
        }
        for key in cameras:
            frame[key] = env.last_frames[key]  # uint8 [H, W, 3]
        dataset.add_frame(frame)

    for attempt_seed in range(seed, seed + attempts_allowed):
        if len(kept) == episodes:
            break
        expert.reset(attempt_seed)
        result = run_episode(env, expert, attempt_seed, on_step=add_frame)
        tried.append(result)
        if result.success or keep_failed:
            dataset.save_episode()
            kept.append(result)
            bar.update(1)
        else:
            dataset.clear_episode_buffer()
        bar.set_postfix(task=env.name.split("/")[-1], expert_success=f"{np.mean([r.success for r in tried]):.0%}")
    if len(kept) < episodes:
        raise ValueError(
            f"the {env.name} expert succeeded in only {len(kept)} of {len(tried)} attempts "
            f"(seeds {seed}..{seed + len(tried) - 1}); record fewer episodes or pass --keep-failed"
        )
    return kept, tried


def _task_summary(env: Env, kept: list[EpisodeResult], tried: list[EpisodeResult]) -> dict[str, Any]:
    return {
        "task": env.name.split("/")[1],
        "task_text": env.task_text,
        "episodes": len(kept),
        "attempts": len(tried),
        "expert_success_rate": summarize(tried)["success_rate"],
        "episode_lengths": [r.length for r in kept],
        "seeds": [r.seed for r in kept],
        "failed_seeds": [r.seed for r in tried if not r.success],
    }


class NoisyExpert:
    """An expert whose executed actions carry Gaussian noise (DART); ``label`` is its clean action for the last
    observation, the one a dataset should store. With ``sigma=0`` it is the expert itself."""

    def __init__(self, expert: Expert, sigma: float):
        self.expert, self.sigma = expert, float(sigma)
        self.rng = np.random.default_rng(0)
        self.label = None

    def reset(self, seed: int) -> None:
        """Start the episode on ``seed``: the expert's own reset, and a noise stream of its own for that seed, so
        each episode reproduces on its own."""
        self.expert.reset(seed)
        self.rng = np.random.default_rng([int(seed), 0xDA27])

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        clean = np.asarray(self.expert(obs), dtype=np.float32)  # [1, D], clipped to the action range
        self.label = clean[0].copy()
        if self.sigma == 0.0:
            return clean
        return np.clip(clean + self.rng.normal(0.0, self.sigma, clean.shape), -1.0, 1.0).astype(np.float32)


def _write_recording_json(out: Path, summary: dict[str, Any]) -> None:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("metaworld", "gym-aloha", "mujoco", "lerobot"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    content = {"format_version": RECORDING_FORMAT, **summary, "versions": versions}
    content.pop("seconds", None)  # machine-dependent: keep the file reproducible
    content.pop("steps_per_s", None)
    write_json(out / RECORDING_FILE, content)


def _remove_empty_dirs(folder: Path) -> None:
    if not folder.is_dir():
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def ensure_dataset(
    root: str | Path = DEFAULT_DATASET_ROOT,
    env_name: str = DEFAULT_ENV,
    episodes: int = DEFAULT_EPISODES,
    *,
    action_noise: float = DEFAULT_ACTION_NOISE,
    env_options: dict[str, Any] | None = None,
    progress: bool = True,
    log=print,
) -> Path:
    """A recorded dataset at ``root`` made with these settings: the one there, else a new recording.

    ``episodes`` is per task (``env_name`` may name several, see ``record``). A folder that ``record`` made with other
    settings (tasks, episode count, action noise, simulator options: say an older default) is recorded again in its
    place; a dataset without ``meta/recording.json`` (not ours) is used as it is.
    """
    root = Path(root)
    env_names(env_name)
    family, task = env_name.split("/")
    wanted = {
        "env": family,
        "task": task,
        "episodes_per_task": int(episodes),
        "action_noise": float(action_noise),
        "env_options": dict(env_options or {}),
    }
    if (root / "meta" / "info.json").is_file():
        recorded = read_recording(root)
        if recorded is None:
            return root
        have = {k: recorded.get(k) for k in wanted}
        have["action_noise"] = float(have["action_noise"] or 0.0)
        have["env_options"] = have["env_options"] or {}
        if have == wanted:
            return root
        changed = ", ".join(f"{k} {have[k]} -> {wanted[k]}" for k in wanted if have[k] != wanted[k])
        log(f"{root} was recorded with other settings ({changed}); recording it again")
    else:
        log(f"recording {episodes} {env_name} expert episodes per task into {root}")
    record(
        env_name, episodes, root, action_noise=action_noise, env_options=env_options, overwrite=True, progress=progress
    )
    return root
