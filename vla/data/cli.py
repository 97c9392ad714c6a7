"""``vla data``: record demonstrations into a LeRobot dataset, and describe a dataset.

vla data record                                   # the demo's dataset: push-v3, 100 episodes, state only
vla data record --env metaworld --task pick-place-v3 --episodes 50 --root DIR --images --image-size 128
vla data record --images --image-format png       # exact PNG frames instead of LeRobot's default video
vla data record --task mt10 --episodes 50         # MT10's ten tasks into one dataset, 50 episodes each
vla data info DIR                                 # what it holds, what `vla train` would choose, what will hurt
vla data stats DIR                                # exact frame statistics into meta/stats.json
vla data convert SRC DST                          # a LeRobot v2.1 dataset -> a new v3.0 one (vla.data.convert)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vla.sim import OBSERVATIONS, TRAIN_SEED_START
from vla.sim.record import (
    DEFAULT_ACTION_NOISE,
    DEFAULT_DATASET_ROOT,
    DEFAULT_ENV,
    DEFAULT_EPISODES,
    DEFAULT_IMAGE_FORMAT,
    DEFAULT_IMAGE_SIZE,
    IMAGE_FORMATS,
    default_root,
    record,
)

DEFAULT_FAMILY, DEFAULT_TASK = DEFAULT_ENV.split("/")


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``data`` (with ``record`` and ``info``) to the ``vla`` command."""
    data = subparsers.add_parser("data", help="record demonstrations into a LeRobot dataset; describe one")

    def usage(args: argparse.Namespace) -> int:  # `vla data` alone
        data.print_help()
        return 2

    data.set_defaults(func=usage)
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    _add_record(sub)

    stats = sub.add_parser(
        "stats",
        help="write exact frame statistics into meta/stats.json (LeRobot's are averaged per-episode quantiles)",
        description="Replace meta/stats.json's action and state entries with exact statistics of every frame "
        "(min, max, mean, std, q01..q99), keeping the original as meta/stats.json.orig, so that any LeRobot policy "
        "trained on the dataset normalises with real quantiles (lerobot issue #4156).",
    )
    stats.add_argument("root", type=Path, help="dataset folder (holding meta/ and data/)")
    stats.set_defaults(func=_stats)

    info = sub.add_parser(
        "info",
        help="describe a LeRobot dataset: what it holds, what training would choose, what will hurt",
        description="Describe a LeRobot v3.0 dataset (episodes, frames, features and their names, cameras and their "
        "sizes), check its files and values, and say what `vla train --dataset_root DIR` would choose from it (chunk "
        "length from the fps, matched state dims, grippers, state history, held-out split) and what will hurt.",
    )
    info.add_argument("root", type=Path, help="dataset folder (holding meta/ and data/)")
    info.add_argument("--json", action="store_true", help="print the recording metadata as JSON too")
    info.set_defaults(func=_info)

    from vla.data.convert import add_cli as add_convert  # vla data convert SRC DST (LeRobot v2.1 -> v3.0)

    add_convert(sub)


def _add_record(sub: argparse._SubParsersAction) -> None:
    """``vla data record``: its options."""
    rec = sub.add_parser(
        "record",
        help="record scripted-expert episodes from a simulator",
        description="Record successful scripted-expert episodes into a new LeRobot v3.0 dataset. With no "
        f"options: {DEFAULT_EPISODES} episodes of {DEFAULT_TASK}, state only, into {DEFAULT_DATASET_ROOT}.",
    )
    rec.add_argument("--env", default=DEFAULT_FAMILY, help="simulator family (default: %(default)s)")
    rec.add_argument(
        "--task",
        default=DEFAULT_TASK,
        help="the family's task (reach-v3), several (drawer-open-v3,drawer-close-v3) or a task set (mt10), all into "
        "one dataset, each episode with its task's instruction (default: %(default)s)",
    )
    rec.add_argument(
        "--episodes",
        type=int,
        default=DEFAULT_EPISODES,
        help=f"episodes to keep per task (default: {DEFAULT_EPISODES})",
    )
    rec.add_argument(
        "--observation",
        choices=OBSERVATIONS,
        default=None,
        help="the simulator's observation: privileged (the state with object and goal poses, the default), "
        "proprio (the robot's own body only, for a camera policy: add --images; Meta-World: hand xyz and gripper, "
        "ALOHA: the 14 joints) or, Meta-World only, lerobot (LeRobot's convention: the 4-D hand and gripper and "
        "its 480 px corner2 camera), which lerobot-eval --env.type=metaworld scores",
    )
    rec.add_argument(
        "--root",
        type=Path,
        default=None,
        help="output folder, which must not exist (default: outputs/datasets/<env>_<task>[_images])",
    )
    rec.add_argument("--images", action="store_true", help="also record a camera image per step")
    rec.add_argument(
        "--image-format",
        choices=IMAGE_FORMATS,
        default=DEFAULT_IMAGE_FORMAT,
        help="how cameras are stored: video (LeRobot's default: AV1 video features by LeRobot's writer, small, lossy) "
        "or png (exact frames in the parquet rows, LeRobot's image dtype) (default: %(default)s)",
    )
    rec.add_argument(
        "--image-size",
        type=int,
        default=None,
        help=f"square image side (default: {DEFAULT_IMAGE_SIZE}; with --observation lerobot, LeRobot's 480)",
    )
    rec.add_argument(
        "--camera",
        action="append",
        default=None,
        dest="cameras",
        help="camera key to record (repeatable; default: the simulator's usual one, Meta-World's "
        "observation.images.corner2)",
    )
    rec.add_argument(
        "--seed",
        type=int,
        default=TRAIN_SEED_START,
        help="first layout seed; episodes use seed, seed+1, ... (default: %(default)s)",
    )
    rec.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the simulator's)")
    rec.add_argument(
        "--keep-failed", action="store_true", help="keep failed episodes too (flagged in meta/recording.json)"
    )
    rec.add_argument(
        "--action-noise",
        type=float,
        default=DEFAULT_ACTION_NOISE,
        help="DART noise: std of the Gaussian added to each executed expert action; the dataset keeps the "
        "expert's own action (default: %(default)s)",
    )
    rec.add_argument("--overwrite", action="store_true", help="replace --root if it exists")
    rec.add_argument("--quiet", action="store_true", help="no progress bar")
    rec.set_defaults(func=_record)


def _record(args: argparse.Namespace) -> int:
    env_name = f"{args.env}/{args.task}"
    root = args.root
    if root is None:
        root = (
            DEFAULT_DATASET_ROOT
            if (env_name, args.images) == (DEFAULT_ENV, False)
            else default_root(env_name, args.images)
        )
    summary = record(
        env_name,
        args.episodes,
        root,
        images=args.images,
        cameras=args.cameras,
        seed=args.seed,
        image_size=args.image_size,
        image_format=args.image_format,
        max_steps=args.max_steps,
        keep_failed=args.keep_failed,
        action_noise=args.action_noise,
        env_options={"observation": args.observation} if args.observation else None,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    lengths = summary["episode_lengths"]
    print(
        f"expert success rate: {summary['expert_success_rate']:.1%} "
        f"({summary['attempts'] - len(summary['failed_seeds'])} of {summary['attempts']} attempts)"
    )
    print(
        f"wrote {summary['episodes']} episodes, {summary['frames']} frames "
        f"(length min {min(lengths)}, mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}) "
        f"to {summary['root']} in {summary['seconds']:.1f} s"
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    from vla.data.stats import write_exact_stats

    print(
        f"wrote exact frame statistics of the action and state to {write_exact_stats(args.root)} "
        "(the original kept as stats.json.orig)"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    from vla.config import load_config
    from vla.data import defaults
    from vla.data.reader import check_files, check_frames, check_values, dataset_info
    from vla.data.videos import check_videos

    info = dataset_info(args.root)
    print(info.describe())
    check_videos(info)  # a missing video file: an error naming it, after the description
    check_files(info)  # a damaged or missing data file: an error naming it and its episodes
    timestamps = check_frames(info)  # rows that disagree with meta/ (tasks, episode lengths): an error saying which
    if timestamps:
        print(f"  WARNING: {timestamps}")
    problems = check_values(info)
    for name, problem in problems.items():
        print(f"  WARNING: '{name}' holds NaN or inf: {problem}")
    if not problems:
        print("  values: action and state are finite")
    # training's own choice (vla.data.defaults.choose) on the config `vla train --dataset_root DIR` starts from
    print("\n".join(defaults.describe(info, load_config(args=[f"--dataset_root={info.root}"]))))
    if args.json and info.recording:
        print(json.dumps(info.recording, indent=2))
    return 0
