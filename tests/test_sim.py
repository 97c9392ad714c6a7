"""vla.sim: the simulator interface and registry, the Meta-World env, the expert through the rollout loop,
recording and its CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla.sim import EVAL_SEED_START, TRAIN_SEED_START, make_env, make_expert, split_name
from vla.sim.metaworld_env import ExpertPolicy, task_text
from vla.sim.record import record
from vla.sim.rollout import run_episode, run_episodes, summarize

PUSH, REACH = "metaworld/push-v3", "metaworld/reach-v3"


def episodes(policy, name: str, n: int, seed_start: int = EVAL_SEED_START, **kwargs) -> dict:
    """``n`` episodes of ``name`` on consecutive seeds, one env, through the rollout loop; the summary."""
    with make_env(name, max_steps=kwargs.pop("max_steps", None)) as env:
        results = [run_episode(env, policy, s, **kwargs) for s in range(seed_start, seed_start + n)]
    return summarize(results)


def test_names_are_family_slash_task_and_unknown_ones_get_suggestions():
    with pytest.raises(ValueError, match="did you mean 'push-v3'"):
        split_name("metaworld/pushh-v3")
    with pytest.raises(ValueError, match="unknown simulator 'metawrld'.*did you mean 'metaworld'"):
        make_env("metawrld/push-v3")
    with pytest.raises(ValueError, match="family/task"):
        make_env("push-v3")
    assert task_text("push-v3") == "push the puck to a goal"
    assert task_text("made-up-task-v3") == "made up task"


def test_reset_seeds_give_reproducible_distinct_layouts():
    with make_env(PUSH) as env:
        a = env.reset(TRAIN_SEED_START)
        b = env.reset(TRAIN_SEED_START + 1)
        again = env.reset(TRAIN_SEED_START)
    assert env.name == PUSH and env.action_dim == 4 and env.fps == 80 and env.max_steps == 500
    assert a["observation.state"].shape == (39,) and a["observation.state"].dtype == np.float32
    assert a["task"] == "push the puck to a goal"
    np.testing.assert_array_equal(a["observation.state"], again["observation.state"])
    assert not np.array_equal(a["observation.state"][-3:], b["observation.state"][-3:])  # goals differ


def test_step_contract_and_bad_actions():
    with make_env(REACH, max_steps=3) as env:
        env.reset(0)
        with pytest.raises(ValueError, match="float \\[4\\]"):
            env.step(np.zeros(3))
        with pytest.raises(ValueError, match="non-finite"):
            env.step(np.array([0, 0, np.nan, 0]))
        for _ in range(3):
            obs, reward, done, info = env.step(np.zeros(4))
        assert done and info["truncated"] and not info["success"] and isinstance(reward, float)
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(np.zeros(4))


def test_images_render_as_float_chw_and_features_describe_them():
    key = "observation.images.corner2"
    with make_env(PUSH, image_keys=[key], image_size=32) as env:
        obs = env.reset(0)
        assert env.features[key]["shape"] == (32, 32, 3) and env.last_frames[key].shape == (32, 32, 3)
    image = obs[key]
    assert image.shape == (3, 32, 32) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.01
    with pytest.raises(ValueError, match="unknown camera 'cornr2'.*did you mean 'corner2'"):
        make_env(PUSH, image_keys=["observation.images.cornr2"])


def test_proprio_observation_hides_objects_and_our_workspace_camera_renders():
    key = "observation.images.workspace"
    with make_env(PUSH, image_keys=[key], image_size=32, observation="proprio") as env:
        obs = env.reset(3)
        assert env.features["observation.state"]["names"] == ["hand_x", "hand_y", "hand_z", "gripper_opening"]
        assert obs["observation.state"].shape == (4,) and obs["expert_state"].shape == (39,)
        np.testing.assert_array_equal(obs["observation.state"], obs["expert_state"][:4])
        assert obs[key].shape == (3, 32, 32) and obs[key].std() > 0.01
        first = obs[key]
        expert = make_expert(PUSH)
        for _ in range(20):  # the expert still reads the whole observation and moves the hand: the image changes
            obs, *_ = env.step(expert(obs)[0])
        assert np.abs(obs[key] - first).max() > 0.1


def test_expert_through_rollout_succeeds_on_eval_seeds():
    report = episodes(make_expert(PUSH), PUSH, 3)
    assert report["seeds"] == [EVAL_SEED_START, EVAL_SEED_START + 1, EVAL_SEED_START + 2]
    assert report["success_rate"] == 1.0
    assert 20 < report["mean_length"] < 200 and report["mean_return"] > 0
    assert len(report["successes"]) == len(report["returns"]) == len(report["lengths"]) == 3


def test_rollout_reproduces_the_recording(tiny_dataset_root):
    """The expert through the rollout loop, on the recording's seeds, does exactly what was recorded."""
    from vla.data.reader import dataset_info

    recording = dataset_info(tiny_dataset_root).recording
    report = episodes(make_expert(PUSH), PUSH, recording["attempts"], seed_start=recording["seed_start"])
    assert report["success_rate"] == pytest.approx(recording["expert_success_rate"])
    kept = [length for length, ok in zip(report["lengths"], report["successes"]) if ok]
    assert kept == recording["episode_lengths"]


class RepeatChunk:
    """A chunk policy: the expert's current action repeated ``horizon`` times, as a torch tensor."""

    def __init__(self, horizon: int):
        self.expert, self.horizon = ExpertPolicy("push-v3"), horizon

    def __call__(self, obs):
        import torch

        return torch.from_numpy(np.repeat(self.expert(obs), self.horizon, axis=0))  # [T, 4]


def test_rollout_executes_n_action_steps_of_each_chunk():
    start = EVAL_SEED_START + 10
    expert = episodes(make_expert(PUSH), PUSH, 2, seed_start=start)
    replan_every_step = episodes(RepeatChunk(horizon=5), PUSH, 2, seed_start=start, n_action_steps=1)
    assert replan_every_step["lengths"] == expert["lengths"]  # only the first action of each chunk ran
    open_loop = episodes(RepeatChunk(horizon=5), PUSH, 2, seed_start=start)
    assert open_loop["lengths"] != expert["lengths"]  # whole chunks ran: a different trajectory


class BatchOf:
    """A batch policy built from a chunk policy, counting how many observations each call saw."""

    def __init__(self, policy):
        self.policy, self.batch_sizes = policy, []

    def __call__(self, observations):
        self.batch_sizes.append(len(observations))
        return np.stack([np.asarray(self.policy(o)) for o in observations])


def test_batched_episodes_match_one_at_a_time():
    seeds = list(range(EVAL_SEED_START + 20, EVAL_SEED_START + 25))
    with make_env(PUSH, max_steps=40) as env:
        one_by_one = [run_episode(env, RepeatChunk(horizon=4), s, n_action_steps=2) for s in seeds]
    envs = [make_env(PUSH, max_steps=40) for _ in range(3)]
    batch = BatchOf(RepeatChunk(horizon=4))
    ended = []
    try:
        batched = run_episodes(envs, batch, seeds, n_action_steps=2, on_episode=ended.append)
    finally:
        for env in envs:
            env.close()
    assert batched == one_by_one  # same seeds, same returns and lengths, in seed order
    assert sorted(r.seed for r in ended) == seeds
    assert max(batch.batch_sizes) == 3 and sum(batch.batch_sizes) == sum(-(-r.length // 2) for r in one_by_one)


class SeesCamera:
    """A chunk policy that moves by the expert and keeps every camera image it was shown."""

    def __init__(self, key: str, horizon: int):
        self.key, self.chunk, self.seen = key, RepeatChunk(horizon), []

    def __call__(self, obs):
        self.seen.append(obs[self.key].copy())
        return self.chunk(obs)


class AlwaysRenders:
    """An env that draws its cameras at every step, whatever the rollout asks (the loop before on-demand drawing)."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action, render=True):
        return self.env.step(action)


@pytest.mark.parametrize("delay", [{}, {"delay_steps": 2, "ahead": True}])
def test_rollout_draws_only_the_frames_the_policy_is_shown(monkeypatch, delay):
    """Each camera frame is drawn only for an observation the policy sees (one step in n_action_steps), and the
    policy sees exactly the images, and the episodes end exactly as, when every step is drawn."""
    key = "observation.images.workspace"
    seeds = [EVAL_SEED_START + 30, EVAL_SEED_START + 31]
    runs = {}
    for always in (True, False):
        with make_env(PUSH, image_keys=[key], image_size=24, observation="proprio", max_steps=30) as env:
            drawn = []
            render = env.render
            monkeypatch.setattr(env, "render", lambda k: drawn.append(k) or render(k))
            policy = SeesCamera(key, horizon=6)
            results = run_episodes(
                [AlwaysRenders(env) if always else env], lambda o: [policy(o[0])], seeds, n_action_steps=3, **delay
            )
            runs[always] = results, policy.seen, len(drawn)
    (every_results, every_seen, every_drawn), (results, seen, drawn) = runs[True], runs[False]
    assert results == every_results and len(seen) == len(every_seen)
    for shown, reference in zip(seen, every_seen):
        np.testing.assert_array_equal(shown, reference)
    assert every_drawn == sum(r.length for r in results) + len(seeds)  # every step and every reset
    # One frame per chunk asked for; at most one more per episode (its last step's, when the episode ended there).
    assert len(seen) <= drawn <= len(seen) + len(seeds) and drawn < every_drawn / 2


def test_batched_episodes_reject_a_short_batch():
    with make_env(REACH, max_steps=5) as env:
        with pytest.raises(ValueError, match="returned 0 chunks for 1 observations"):
            run_episodes([env], lambda observations: np.zeros((0, 2, 4)), [EVAL_SEED_START])


def test_rollout_rejects_malformed_policy_output():
    with pytest.raises(ValueError, match=r"actions \[T, 4\]"):
        episodes(lambda obs: np.zeros((2, 3)), REACH, 1, max_steps=5)
    with pytest.raises(ValueError, match="n_action_steps"):
        episodes(make_expert(REACH), REACH, 1, n_action_steps=0)


# -- recording -------------------------------------------------------------------------------------


def test_record_refuses_existing_root_and_eval_seeds(tiny_dataset_root, tmp_path):
    with pytest.raises(ValueError, match="already exists"):
        record(PUSH, 1, tiny_dataset_root, progress=False)
    with pytest.raises(ValueError, match="kept for evaluation"):
        record(PUSH, 5, tmp_path / "ds", seed=EVAL_SEED_START - 3, progress=False)
    with pytest.raises(ValueError, match="did you mean 'reach-v3'"):
        record("metaworld/reach-v2", 1, tmp_path / "ds", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_failed_recording_leaves_nothing(tmp_path):
    # 5 steps are too few for the expert to push the puck anywhere: every attempt fails
    with pytest.raises(ValueError, match="succeeded in only 0 of"):
        record(PUSH, 1, tmp_path / "ds", max_steps=5, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_recording_leaves_nothing(tmp_path, monkeypatch):
    from vla.sim import record as record_module

    calls = []

    def run_then_interrupt(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return original(*args, **kwargs)

    original = record_module.run_episode
    monkeypatch.setattr(record_module, "run_episode", run_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        record(REACH, 3, tmp_path / "ds", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_keep_failed_records_flags(tmp_path):
    summary = record(REACH, 2, tmp_path / "ds", max_steps=8, keep_failed=True, progress=False)
    assert summary["episodes"] == 2 and summary["episode_lengths"] == [8, 8]
    assert summary["episode_success"] == [False, False] and summary["expert_success_rate"] == 0.0


def test_cli_records_and_prints_the_success_rate(tmp_path, capsys):
    from vla.cli import main

    root = tmp_path / "cli"
    assert main(["data", "record", "--task", "reach-v3", "--episodes", "2", "--root", str(root), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "expert success rate: 100.0%" in out and "wrote 2 episodes" in out
    assert (root / "meta" / "recording.json").is_file()
    assert main(["data", "info", str(root)]) == 0
    assert "2 episodes" in capsys.readouterr().out
    assert main(["data", "record", "--task", "rech-v3", "--root", str(tmp_path / "x"), "--quiet"]) == 1
    assert "did you mean 'reach-v3'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_noisy_recording_stores_the_experts_action_and_reproduces(tmp_path):
    """DART noise: the env runs perturbed actions, the dataset keeps the expert's action for each stored state."""
    from vla.data import reader

    def frames(root):
        info = reader.dataset_info(root)
        return info, reader._read_frames(info, list(range(info.num_episodes)), ["observation.state", "action"])

    noisy = record(PUSH, 2, tmp_path / "noisy", action_noise=0.3, progress=False)
    again = record(PUSH, 2, tmp_path / "again", action_noise=0.3, progress=False)
    clean = record(PUSH, 2, tmp_path / "clean", progress=False)
    info, got = frames(tmp_path / "noisy")
    assert info.recording["action_noise"] == 0.3 and clean["action_noise"] == 0.0
    expert = ExpertPolicy("push-v3")
    labels = np.stack([expert({"observation.state": s})[0] for s in got["observation.state"]])
    np.testing.assert_array_equal(got["action"], labels)
    _, repeat = frames(tmp_path / "again")
    np.testing.assert_array_equal(repeat["observation.state"], got["observation.state"])  # seeded per episode
    assert again["episode_lengths"] == noisy["episode_lengths"]
    _, plain = frames(tmp_path / "clean")
    n = min(len(plain["action"]), len(got["action"]))
    assert not np.allclose(plain["observation.state"][:n], got["observation.state"][:n])  # the noise ran
    with pytest.raises(ValueError, match="action_noise"):
        record(PUSH, 1, tmp_path / "bad", action_noise=-0.1, progress=False)


def test_ensure_dataset_records_again_only_when_the_settings_changed(tmp_path, monkeypatch):
    from vla.sim import record as record_module

    root, said = tmp_path / "ds", []
    record_module.ensure_dataset(root, REACH, 1, log=said.append, progress=False)
    assert "recording 1 metaworld/reach-v3" in said[-1]
    recorded = []  # the keyword arguments of every recording from here on
    monkeypatch.setattr(record_module, "record", lambda *a, **k: recorded.append(k) or record(*a, **k))
    record_module.ensure_dataset(root, REACH, 1, log=said.append, progress=False)
    assert recorded == []  # same settings: the dataset there is used
    record_module.ensure_dataset(root, REACH, 1, action_noise=0.2, log=said.append, progress=False)
    assert "action_noise 0.0 -> 0.2" in said[-1] and recorded[-1]["overwrite"]
    assert json.loads((root / "meta" / "recording.json").read_text())["action_noise"] == 0.2
    (root / "meta" / "recording.json").unlink()  # not recorded by us: used as it is, whatever it holds
    record_module.ensure_dataset(root, REACH, 5, log=said.append, progress=False)
    assert len(recorded) == 1


def test_task_sets_and_lists_name_several_envs():
    from vla.sim import env_names

    mt10 = env_names("metaworld/mt10")
    assert len(mt10) == 10 and "metaworld/drawer-close-v3" in mt10 and "metaworld/window-open-v3" in mt10
    assert env_names("metaworld/drawer-open-v3, drawer-close-v3") == [
        "metaworld/drawer-open-v3",
        "metaworld/drawer-close-v3",
    ]
    with pytest.raises(ValueError, match="did you mean 'drawer-open-v3'"):
        env_names("metaworld/drawr-open-v3")
    with pytest.raises(ValueError, match="twice"):
        env_names("metaworld/push-v3,push-v3")


def test_multitask_recording_holds_every_task_with_its_instruction(tmp_path):
    from vla.data.reader import dataset_info, read_recording
    from vla.sim.record import record

    root = tmp_path / "two"
    summary = record("metaworld/drawer-open-v3,drawer-close-v3", 2, root, progress=False)
    assert summary["episodes"] == 4 and [t["task"] for t in summary["tasks"]] == ["drawer-open-v3", "drawer-close-v3"]
    info = dataset_info(root)
    assert info.num_episodes == 4
    assert sorted(info.tasks) == ["open a drawer", "push and close a drawer"]  # plain sentences, not task names
    recording = read_recording(root)
    assert recording["episodes_per_task"] == 2 and recording["tasks"][1]["task_text"] == "push and close a drawer"


def test_mixed_task_episodes_run_each_on_its_own_env():
    from vla.sim.rollout import run_episodes

    envs = [make_env("metaworld/reach-v3"), make_env("metaworld/drawer-close-v3")]
    experts = {env.name: make_expert(env.name) for env in envs}
    seen: list[str] = []

    def policy(observations):
        seen.extend(o["task"] for o in observations)
        return [
            experts["metaworld/reach-v3" if o["task"].startswith("reach") else "metaworld/drawer-close-v3"](o)
            for o in observations
        ]

    episodes = [
        ("metaworld/drawer-close-v3", EVAL_SEED_START),
        ("metaworld/reach-v3", EVAL_SEED_START),
        ("metaworld/drawer-close-v3", EVAL_SEED_START + 1),
    ]
    results = run_episodes(envs, policy, episodes)
    assert [r.env for r in results] == [name for name, _ in episodes]
    assert all(r.success for r in results)
    assert {"reach a goal position", "push and close a drawer"} <= set(seen)
    with pytest.raises(ValueError, match="no env runs"):
        run_episodes(envs[:1], policy, episodes)
    for env in envs:
        env.close()


def test_recording_images_from_a_simulator_without_cameras_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no camera"):
        record("toy/obstacle", 1, tmp_path / "toy", images=True, progress=False)
    assert not (tmp_path / "toy").exists()
