"""Datasets as found in the wild, and the settings `vla train` chooses from them when given only --dataset_root:
feature names in every layout read flat, the choices (chunk length from the fps, state dims matched by name or by
values, grippers absolute, a state history for state-only data, the held-out report) with explicit values winning,
`vla data info` printing training's own choices, and a matrix of dataset shapes trained with the defaults alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import action_tokenizers as at
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla import train
from vla.cli import main
from vla.config import load_config
from vla.data import defaults, reader
from vla.data.meta import flat_names
from vla.policy import VLAConfig, VLAPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration per encoded episode otherwise

TINY = [
    "--policy.preset=micro",
    "--policy.device=cpu",
    "--batch_size=4",
    "--steps=2",
    "--log_every=1",
    "--save_every=100",
    "--eval_chunks=4",
    "--report_chunks=8",
    "--progress=false",
    "--tokenizer.type=fast",
    "--tokenizer.vocab_size=256",
]  # sizes only: every other setting chosen


def make_dataset(
    root: Path,
    *,
    fps: int = 10,
    episodes: int = 4,
    frames: int = 20,
    state: int | None = 3,
    action: int = 3,
    cameras: dict[str, tuple[int, int]] | None = None,
    video: bool = False,
    action_names: list[str] | None = None,
    state_names: list[str] | None = None,
) -> Path:
    """A LeRobot v3.0 dataset: joints that sweep per episode; the action is the next frame's joints (the state tracks
    the action: state dim j+1 holds action dim j, dim 0 is a constant), the last action dim a gripper that closes
    halfway; ``cameras``: key -> (height, width), as video or PNG."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cameras = cameras or {}
    features = {"action": {"dtype": "float32", "shape": (action,), "names": action_names}}
    if state is not None:
        features["observation.state"] = {"dtype": "float32", "shape": (state,), "names": state_names}
    for key, (h, w) in cameras.items():
        features[key] = {
            "dtype": "video" if video else "image",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        }
    ds = LeRobotDataset.create(
        "local/own", fps=fps, features=features, root=root, use_videos=video, video_backend="pyav"
    )
    for e in range(episodes):
        k = np.arange(frames + 1, dtype=np.float64)
        joints = np.stack([10.0 * (e + 1) * np.sin(k / 5.0 + j + e) for j in range(action)], 1)  # [frames + 1, A]
        joints[:, -1] = np.where(k < frames / 2, 80.0, 5.0)  # the gripper
        for t in range(frames):
            frame = {"action": joints[t + 1].astype(np.float32), "task": "pick the cube"}
            if state is not None:
                s = np.zeros(state, np.float32)
                s[1 : 1 + min(action, state - 1)] = joints[t, : state - 1]
                frame["observation.state"] = s
            for key, (h, w) in cameras.items():
                image = np.zeros((h, w, 3), np.uint8)
                image[:, (3 * t) % w] = 200
                frame[key] = image
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


def set_names(root: Path, feature: str, names) -> None:
    """meta/info.json's names of ``feature`` replaced (the layouts found in the wild)."""
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info["features"][feature]["names"] = names
    path.write_text(json.dumps(info, indent=2))


def tiny_run(root: Path, out: Path, *extra: str) -> dict:
    """`vla train --dataset_root ROOT` with tiny sizes and nothing else chosen; the run's saved config."""
    cfg = load_config(args=[f"--dataset_root={root}", f"--output_dir={out}", *TINY, *extra])
    train.main(cfg)
    return json.loads((out / "train_config.json").read_text())


# -- names in any layout ----------------------------------------------------------------------------------------

name_lists = st.lists(
    st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8), min_size=1, max_size=30
)


@settings(max_examples=200, deadline=None)
@given(names=name_lists, layout=st.sampled_from(["flat", "one list", "dict", "dict of several", "tuple"]))
def test_names_in_every_layout_read_as_one_flat_list(names, layout):
    cut = len(names) // 2
    wrapped = {
        "flat": names,
        "one list": [names],
        "dict": {"motors": names},
        "tuple": tuple(names),
        "dict of several": {"arm": names[:cut], "gripper": names[cut:]},
    }[layout]
    assert flat_names(wrapped, len(names)) == (names, None)
    dropped, note = flat_names(wrapped, len(names) + 1, "meta/info.json: features.action.names")
    assert dropped is None and f"lists {len(names)} names for {len(names) + 1} values" in note
    assert flat_names(None, len(names)) == (None, None)


def test_a_list_holding_one_list_of_26_names_trains_with_relative_actions(tmp_path):
    """A 26-D humanoid's v2.1 layout ([[26 names]]) was read as one name: relative_actions 'auto' failed with "give one
    entry per action dimension (26)" and the offline report had one row. Now 26 names, a 26-long mask, 26 rows."""
    names = [f"joint_{i}.pos" for i in range(25)] + ["left_gripper.pos"]
    root = make_dataset(tmp_path / "humanoid", action=26, state=27, frames=12)
    set_names(root, "action", [names])
    set_names(root, "observation.state", {"motors": ["speed"] + names})
    info = reader.dataset_info(root)
    assert info.action_names == names and info.state_names == ["speed"] + names
    saved = tiny_run(root, tmp_path / "run")
    assert saved["policy"]["action_state_dims"] == list(range(1, 27))  # matched by name
    assert saved["policy"]["relative_actions"] == [True] * 25 + [False]  # the gripper absolute
    report = json.loads((tmp_path / "run" / "offline_report.json").read_text())
    assert report["action_names"] == names and len(report["policy"]["rmse_per_dim"]) == 26


def test_names_that_do_not_fit_the_shape_are_ignored_and_said(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", episodes=2)
    set_names(root, "action", ["a", "b"])  # 2 names for 3 values
    assert reader.dataset_info(root).action_names is None
    assert main(["data", "info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "NOTE: " in out and "features.action.names lists 2 names for 3 values; they are ignored" in out


# -- the choices --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arm_50hz(tmp_path_factory) -> Path:
    """50 Hz, 4-D state (a constant, then the 3 joints), 3-D action named differently from the state."""
    return make_dataset(
        tmp_path_factory.mktemp("own") / "arm50",
        fps=50,
        frames=40,
        state=4,
        action_names=["shoulder", "elbow", "gripper"],
        state_names=["speed", "j1", "j2", "j3"],
    )


def test_defaults_are_chosen_from_the_data_and_say_why(arm_50hz):
    info = reader.dataset_info(arm_50hz)
    cfg, choices = defaults.choose(load_config(args=[f"--dataset_root={arm_50hz}"]), info)
    why = {c.name: c.why for c in choices}
    assert cfg.policy.time_horizon == round(defaults.CHUNK_SECONDS * 50) and "at 50 fps" in why["policy.time_horizon"]
    assert cfg.policy.n_action_steps == cfg.policy.time_horizon // 2
    assert cfg.policy.action_state_dims == [1, 2, 3] and "matched by values" in why["policy.action_state_dims"]
    assert cfg.policy.relative_actions == [True, True, False] and "2 (gripper)" in why["policy.relative_actions"]
    assert cfg.policy.n_obs_steps == defaults.STATE_HISTORY and cfg.policy.image_keys == []
    assert cfg.heldout_episodes == defaults.HELDOUT_SHARE and cfg.policy.scheduler_decay_steps == cfg.steps
    assert cfg.policy.decoding == "autoregressive" and "depend on each other" in why["policy.decoding"]  # FAST
    assert cfg.policy.unresolved() == [] and set(cfg.chosen) == {c.name for c in choices}
    warned = defaults.warnings(info, cfg.policy)
    assert any("state dims 0 (speed) never change" in w for w in warned)
    assert any("named differently" in w and "[1, 2, 3]" in w for w in warned)


def test_an_explicit_value_always_wins(arm_50hz):
    info = reader.dataset_info(arm_50hz)
    args = [
        f"--dataset_root={arm_50hz}",
        "--policy.time_horizon=7",
        "--policy.n_action_steps=7",
        "--heldout_episodes=0",
        "--policy.n_obs_steps=1",
        "--policy.relative_actions=none",
        "--policy.action_state_dims=[3,2,1]",
    ]
    cfg, choices = defaults.choose(load_config(args=args), info)
    p = cfg.policy
    assert (p.time_horizon, p.n_action_steps, p.n_obs_steps, cfg.heldout_episodes) == (7, 7, 1, 0.0)
    assert p.relative_actions == "none" and p.action_state_dims == [3, 2, 1]
    assert {c.name for c in choices if c.given} >= {
        "policy.time_horizon",
        "heldout_episodes",
        "policy.n_obs_steps",
        "policy.relative_actions",
        "policy.action_state_dims",
    }
    binned = [f"--dataset_root={arm_50hz}", "--tokenizer.type=bin"]
    cfg, choices = defaults.choose(load_config(args=binned), info)
    assert cfg.policy.decoding == "parallel" and "push_pixels_bin" in cfg.chosen["policy.decoding"]
    cfg, choices = defaults.choose(load_config(args=[*binned, "--policy.decoding=autoregressive"]), info)
    assert cfg.policy.decoding == "autoregressive" and "policy.decoding" not in cfg.chosen
    seconds = defaults.choose(load_config(args=[f"--dataset_root={arm_50hz}", "--policy.chunk_seconds=0.3"]), info)[0]
    assert seconds.policy.time_horizon == 15  # 0.3 s at 50 fps


def test_the_actions_run_per_chunk_are_bounded_by_the_chunk_the_data_decides(arm_50hz):
    """With chunk_seconds, T is decided from the data's fps when training starts: n_action_steps above the field's
    placeholder T (10) is accepted, and bounded by the decided chunk instead."""
    info = reader.dataset_info(arm_50hz)
    base = [f"--dataset_root={arm_50hz}", "--policy.time_horizon=10", "--policy.chunk_seconds=0.5"]
    cfg = defaults.choose(load_config(args=[*base, "--policy.n_action_steps=20"]), info)[0]
    assert (cfg.policy.time_horizon, cfg.policy.n_action_steps) == (25, 20)  # 0.5 s at 50 fps
    with pytest.raises(ValueError, match=r"n_action_steps.*time_horizon \(25\)"):
        defaults.choose(load_config(args=[*base, "--policy.n_action_steps=30"]), info)
    with pytest.raises(ValueError, match=r"time_horizon \(10\)"):  # a T that stands bounds it at once
        load_config(args=[f"--dataset_root={arm_50hz}", "--policy.time_horizon=10", "--policy.n_action_steps=20"])
    # a saved policy keeps chunk_seconds: building it bounds n_action_steps by its final T
    config = VLAConfig(preset="micro", time_horizon=4, chunk_seconds=0.5, n_action_steps=40, device="cpu")
    chunks = np.zeros((8, 4, 3))
    with pytest.raises(
        ValueError, match=r"n_action_steps = 40 is invalid: use 1 <= n_action_steps <= time_horizon \(4\)"
    ):
        VLAPolicy(
            config,
            action_tokenizer=at.BinningTokenizer.fit(chunks, n_bins=16),
            action_normalizer=at.Normalizer.fit(np.random.default_rng(0).standard_normal((50, 3))),
            state_normalizer=at.Normalizer.fit(np.random.default_rng(1).standard_normal((50, 5))),
        )


def test_a_delay_makes_the_chunk_long_enough_to_cover_it(arm_50hz):
    """With policy.delay_ms, the chunk is raised so that the actions run from it last while the next is on its way:
    the delay's steps plus the actions run per chunk (half a chunk when unset)."""
    info = reader.dataset_info(arm_50hz)

    def chosen(*args: str):
        cfg, choices = defaults.choose(load_config(args=[f"--dataset_root={arm_50hz}", *args]), info)
        return cfg.policy, next(c for c in choices if c.name == "policy.time_horizon")

    policy, choice = chosen("--policy.delay_ms=300")  # 15 steps at 50 fps; the default 0.5 s chunk is 25
    assert (policy.time_horizon, policy.n_action_steps) == (30, 15) and "raised to 30" in choice.why
    assert chosen("--policy.delay_ms=100")[0].time_horizon == 25  # 5 steps: the default chunk covers it
    policy, choice = chosen("--policy.chunk_seconds=0.2", "--policy.delay_ms=300", "--policy.n_action_steps=4")
    assert (policy.time_horizon, policy.n_action_steps) == (19, 4) and "4 actions run" in choice.why  # 15 + 4
    policy, choice = chosen("--policy.time_horizon=10", "--policy.delay_ms=300")  # a given T is raised too
    assert policy.time_horizon == 30 and not choice.given
    policy, choice = chosen("--policy.time_horizon=40", "--policy.delay_ms=300")  # ... and stands when it covers it
    assert policy.time_horizon == 40 and choice.given
    with pytest.raises(ValueError, match="delay_ms"):
        chosen("--policy.delay_ms=-5")


def test_every_config_file_keeps_its_fixed_defaults():
    """configs/*.yaml start from the fixed defaults: nothing in them is left to be chosen from the data."""
    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        cfg = load_config(str(path))
        assert cfg.policy.unresolved() == [] and cfg.heldout_episodes is not None, path.name
    piper = load_config(str(Path(__file__).parents[1] / "configs" / "piper_grape.yaml"))
    assert piper.dataset_root == "../shared/data/real/piper_grape"  # beside the project, not a machine's own path


def test_data_info_prints_the_choices_training_makes(arm_50hz, tmp_path, capsys):
    assert main(["data", "info", str(arm_50hz)]) == 0
    info_lines = capsys.readouterr().out.splitlines()
    start = info_lines.index("what `vla train --dataset_root DIR` would choose:")
    said = [
        line.strip()
        for line in info_lines[start + 1 :]
        if line.startswith("  ") and " = " in line and not line.strip().startswith("WARNING")
    ]
    saved = tiny_run(arm_50hz, tmp_path / "run")
    trained = [
        line.removeprefix("chose ") for line in capsys.readouterr().out.splitlines() if line.startswith("chose ")
    ]
    sizes = {"policy.scheduler_decay_steps"}  # the run's --steps=2 against the default 3000
    assert [s for s in said if s.split(" = ")[0] not in sizes] == [t for t in trained if t.split(" = ")[0] not in sizes]
    assert saved["chosen"]["policy.time_horizon"].startswith(f"{saved['policy']['time_horizon']}: ")
    assert saved["policy"]["n_obs_steps"] == defaults.STATE_HISTORY and saved["heldout_episodes"] == 0.1


def test_a_resumed_run_keeps_its_own_choices(arm_50hz, tmp_path, capsys):
    """Resuming with more --steps would choose another decay: the run keeps the choices it started with."""
    first = tiny_run(arm_50hz, tmp_path / "run")
    cfg = load_config(
        args=[f"--dataset_root={arm_50hz}", f"--output_dir={tmp_path / 'run'}", *TINY, "--steps=3", "--resume=true"]
    )
    assert train.main(cfg)["steps"] == 3
    assert "chose policy.scheduler_decay_steps = 2: kept from the run being resumed" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["chosen"] == first["chosen"]


# -- a matrix of shapes, each trained with the defaults alone ---------------------------------------------------

SHAPES = {
    "state_ne_action": dict(state=5, action=3, action_names=["a", "b", "gripper"], state_names=list("vwxyz")),
    "no_state": dict(state=None, cameras={"observation.images.top": (24, 32)}),
    "two_cameras": dict(cameras={"observation.images.top": (24, 32), "observation.images.wrist": (16, 20)}),
    "video": dict(cameras={"observation.images.top": (32, 32)}, video=True, episodes=3),
    "nested_names_50hz": dict(state=4, fps=50, frames=40),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_trains_with_the_defaults_and_reports(shape, tmp_path):
    root = make_dataset(tmp_path / shape, **SHAPES[shape])
    if shape == "nested_names_50hz":
        set_names(root, "action", [["j0", "j1", "gripper"]])
        set_names(root, "observation.state", {"motors": ["c", "j0", "j1"], "grippers": ["gripper"]})
    info = reader.dataset_info(root)
    saved = tiny_run(root, tmp_path / "run")
    p = saved["policy"]
    assert p["time_horizon"] == max(1, round(defaults.CHUNK_SECONDS * info.fps))
    assert p["image_keys"] == info.camera_keys
    assert p["n_obs_steps"] == (defaults.STATE_HISTORY if info.state_dim and not info.camera_keys else 1)
    report = json.loads((tmp_path / "run" / "offline_report.json").read_text())
    assert report["n_chunks"] > 0 and np.isfinite(report["policy"]["rmse"])
    assert len(report["action_names"]) == info.action_dim
    if shape == "nested_names_50hz":  # matched by name once read flat
        assert report["action_names"] == ["j0", "j1", "gripper"] and p["relative_actions"] == [True, True, False]
    if shape == "state_ne_action":  # 5-D state, 3-D action named differently: matched by values
        assert p["action_state_dims"] == [1, 2, 3] and report["baselines"]["hold_state"] is not None
    if shape == "no_state":
        assert report["baselines"]["hold_state"] is None and p["relative_actions"] == "none"
    if shape == "two_cameras":  # a 3-D state and a 3-D action that do not track each other: one to one, all absolute
        assert p["action_state_dims"] == [0, 1, 2] and p["relative_actions"] == [False, False, False]
    # and the saved policy answers one request as a robot sends it (openpi's client, cameras at their own sizes)
    wcp = pytest.importorskip("openpi_client.websocket_client_policy")
    from vla.policy import VLAPolicy
    from vla.serve.server import PolicyServer, ServeConfig

    obs = {"prompt": info.tasks[0]}
    if info.state_dim:
        obs["observation/state"] = np.zeros(info.state_dim, np.float32)
    for key in info.camera_keys:
        obs[key.replace(".", "/")] = np.zeros((*info.camera_shape(key), 3), np.uint8)
    with PolicyServer(
        VLAPolicy.from_pretrained(tmp_path / "run" / "policy"), ServeConfig(port=0)
    ).start_in_thread() as h:
        reply = wcp.WebsocketClientPolicy("127.0.0.1", h.port).infer(obs)
    assert reply["actions"].shape == (p["time_horizon"], info.action_dim) and np.isfinite(reply["actions"]).all()
