"""Training: a few steps on a tiny recorded dataset; checkpoint + resume continues exactly."""

import json

import action_tokenizers as at
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import assert_plot
from vla import train
from vla.config import TrainConfig, load_config
from vla.data.stats import frame_stats
from vla.policy import VLAConfig
from vla.policy.factory import build_policy
from vla.run_folder import RunFolder
from vla.tokenizer_choice import tokenizer_config


def config(root, out, steps, **kw) -> TrainConfig:
    return TrainConfig(
        dataset_root=str(root),
        output_dir=str(out),
        tokenizer=kw.pop("tokenizer", tokenizer_config("fast", vocab_size=256)),
        policy=kw.pop(
            "policy",
            VLAConfig(
                preset="micro",
                time_horizon=4,
                n_action_steps=2,
                scheduler_warmup_steps=1,
                scheduler_decay_steps=4,
                device="cpu",
            ),
        ),
        steps=steps,
        batch_size=4,
        save_every=2,
        log_every=1,
        progress=False,
        **kw,
    )


def test_resume_continues_exactly(tiny_dataset_root, tmp_path):
    # decay over 2 steps: LeRobot's schedule then depends on the step only, not on the run's length
    policy = VLAConfig(
        preset="micro",
        time_horizon=4,
        n_action_steps=2,
        scheduler_warmup_steps=1,
        scheduler_decay_steps=2,
        device="cpu",
    )
    straight = train.main(config(tiny_dataset_root, tmp_path / "a", steps=4, policy=policy))
    first = train.main(config(tiny_dataset_root, tmp_path / "b", steps=2, policy=policy))
    resumed = train.main(config(tiny_dataset_root, tmp_path / "b", steps=4, resume=True, policy=policy))
    assert first["losses"] == straight["losses"][:2]
    np.testing.assert_allclose(resumed["losses"], straight["losses"][2:], rtol=1e-6)
    a = load_file(str(tmp_path / "a" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # the metrics file of the resumed run continues the first one, and a loss curve is drawn
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert_plot(tmp_path / "b" / "loss.png")


def test_checkpoints_are_complete_and_tokenizer_travels(tiny_dataset_root, tmp_path):
    train.main(config(tiny_dataset_root, tmp_path, steps=2, tokenizer=tokenizer_config("bin", n_bins=64)))
    ckpt = train.latest_checkpoint(tmp_path)
    assert ckpt.name == "step_0000002"
    names = {p.name for p in ckpt.iterdir()}
    assert {"policy", "optimizer.safetensors", "rng.safetensors", "trainer_state.json", "ema.safetensors"} <= names
    assert (ckpt / "policy" / "action_tokenizer" / "action_tokenizer.json").is_file()
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    saved = json.loads((ckpt / "policy" / "config.json").read_text())
    assert saved["text_words"][:4] == ["Task:", ", State:", ";\n", "Action: "]  # the prompt's words, one id each


def test_resume_without_checkpoint_is_a_clear_error(tiny_dataset_root, tmp_path):
    with pytest.raises(ValueError, match="holds no checkpoint"):
        train.main(config(tiny_dataset_root, tmp_path, steps=2, resume=True))


def test_step_sampler_is_a_function_of_the_step():
    a = train.StepBatchSampler(10, 4, seed=1, start_step=0, steps=6)
    b = train.StepBatchSampler(10, 4, seed=1, start_step=3, steps=6)
    assert list(a)[3:] == list(b)
    assert sorted(sum(list(a)[:5], [])[:20]) == sorted(list(range(10)) * 2)  # every sample once per epoch


def test_lr_schedule_is_the_policy_configs_lerobot_preset(tiny_dataset_root, tmp_path):
    """vla train steps LeRobot's cosine-with-warm-up preset of the policy config: warm-up, peak, decay to decay_lr."""
    policy = VLAConfig(
        preset="micro",
        time_horizon=4,
        n_action_steps=2,
        optimizer_lr=1e-3,
        scheduler_warmup_steps=2,
        scheduler_decay_steps=8,
        scheduler_decay_lr=1e-4,
        device="cpu",
    )
    train.main(config(tiny_dataset_root, tmp_path, steps=8, policy=policy))
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs[0] < lrs[1] <= 1e-3  # warming up
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:])) and lrs[-1] == pytest.approx(1e-4, rel=1e-6)


def test_debug_config_trains_on_a_fixture_dataset(tiny_dataset_root, tmp_path):
    """configs/debug.yaml, as a user runs it (draccus reads --config_path), on the fixture dataset."""
    cfg = load_config(
        args=[
            "--config_path=configs/debug.yaml",
            f"--dataset_root={tiny_dataset_root}",
            f"--output_dir={tmp_path}",
            "--steps=6",
            "--progress=false",
        ]
    )
    summary = train.main(cfg)
    assert summary["steps"] == 6 and np.isfinite(summary["final_loss"]) and len(summary["losses"]) == 6
    assert (tmp_path / "policy" / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "train_config.json").read_text())
    assert saved["tokenizer"]["type"] == "fast"
    again = load_config(str(tmp_path / "train_config.json"))  # the saved config loads back as it is
    assert again.steps == 6 and again.tokenizer.type == "fast" and again.policy.scheduler_decay_steps == 50


def test_workers_pack_the_same_batches(tiny_dataset_root, tmp_path):
    """Tokenising and packing in two DataLoader workers gives the run the main process gives, committed actions
    shown to the prefix (``commit_condition``) included."""
    policy = VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, device="cpu", commit_condition=3)
    for name, kw in (("plain", {}), ("committed", {"policy": policy})):
        main_process = train.main(config(tiny_dataset_root, tmp_path / name / "a", steps=3, **dict(kw)))
        workers = train.main(config(tiny_dataset_root, tmp_path / name / "b", steps=3, num_workers=2, **dict(kw)))
        np.testing.assert_allclose(workers["losses"], main_process["losses"], rtol=1e-6)


def test_normalisers_come_from_the_training_frames(tiny_dataset_root, tmp_path):
    """Exact quantiles of the training episodes' frames, not stats.json's averaged per-episode ones."""
    from vla.data import reader

    info = reader.dataset_info(tiny_dataset_root)
    train_eps = [0, 1, 2]
    policy = build_policy(config(tiny_dataset_root, tmp_path, steps=1), info, train_eps)
    exact = frame_stats(tiny_dataset_root, ["observation.state", "action"], episodes=train_eps)
    for normalizer, key in ((policy.state_normalizer, "observation.state"), (policy.action_normalizer, "action")):
        lo, hi = exact[key]["q01"], exact[key]["q99"]
        varying = hi - lo > 1e-6
        np.testing.assert_allclose(normalizer.offset, (hi + lo) / 2, atol=1e-9)
        np.testing.assert_allclose(normalizer.scale[varying], ((hi - lo) / 2)[varying], atol=1e-9)


def test_heldout_measurement_leaves_training_alone(tiny_dataset_root, tmp_path):
    """Measuring every step (EMA weights swapped in and out, eval mode, decoding) gives the losses and weights of
    a run measured only at its end; the rows carry the held-out numbers, and push-v3's 39-D state does not hold
    its 4-D action, so the hold-state baseline is reported as not defined."""
    every = train.main(
        config(
            tiny_dataset_root,
            tmp_path / "a",
            steps=3,
            heldout_episodes=0.25,
            eval_every=1,
            eval_chunks=4,
            report_chunks=8,
        )
    )
    once = train.main(
        config(
            tiny_dataset_root,
            tmp_path / "b",
            steps=3,
            heldout_episodes=0.25,
            eval_every=100,
            eval_chunks=4,
            report_chunks=8,
        )
    )
    np.testing.assert_allclose(every["losses"], once["losses"], rtol=1e-6)
    a = load_file(str(tmp_path / "a" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "policy" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "heldout_rmse" in r] == [1, 2, 3]
    assert rows[-1]["heldout_hold_state_rmse"] is None and rows[-1]["heldout_mean_action_rmse"] > 0
    saved = json.loads((tmp_path / "a" / "heldout.json").read_text())
    assert saved["heldout_episodes"] == every["heldout_episodes"] and len(saved["heldout_episodes"]) == 1
    assert not set(saved["heldout_episodes"]) & set(saved["train_episodes"])
    report = json.loads((tmp_path / "a" / "offline_report.json").read_text())
    assert report["beats_hold_state"] is None and "action_state_dims" in report["hold_state_undefined_because"]
    assert "not defined" in (tmp_path / "a" / "offline_report.md").read_text()


def test_weighted_step_sampler_draws_by_weight_and_resumes():
    weights = np.array([1.0] * 8 + [0.0] * 2)
    a = train.StepBatchSampler(10, 4, seed=1, start_step=0, steps=50, weights=weights)
    b = train.StepBatchSampler(10, 4, seed=1, start_step=20, steps=50, weights=weights)
    assert list(a)[20:] == list(b)
    drawn = sum(list(a), [])
    assert set(drawn) == set(range(8))  # weight 0 never drawn
    with pytest.raises(ValueError, match="sampling weights"):
        train.StepBatchSampler(10, 4, seed=1, start_step=0, steps=5, weights=np.zeros(10))


# --- fine-tuning a saved policy (vla train --policy.path=DIR) -------------------------------------------------------
FINETUNE = [
    "--heldout_episodes=0",
    "--batch_size=4",
    "--save_every=2",
    "--log_every=1",
    "--progress=false",
    "--steps=2",
]


def test_finetuning_starts_from_the_saved_weights_and_keeps_tokenizer_and_normalisers(
    tiny_dataset_root, tmp_path, capsys
):
    from vla.cli import main

    source = train.main(config(tiny_dataset_root, tmp_path / "source", steps=2))["policy_path"]
    out = tmp_path / "finetuned"
    # a learning rate that barely moves the weights: what comes out is what went in, so training started from it
    assert (
        main(
            [
                "train",
                f"--policy.path={source}",
                f"--dataset_root={tiny_dataset_root}",
                f"--output_dir={out}",
                "--policy.optimizer_lr=1e-9",
                "--policy.scheduler_decay_lr=0",
                *FINETUNE,
            ]
        )
        == 0
    )
    assert f"fine-tuning {source}: its weights, fast tokenizer and normalisers kept" in capsys.readouterr().out
    for name in (
        "action_tokenizer/action_tokenizer.json",
        "action_tokenizer/bpe.json",
        "action_normalizer.json",
        "state_normalizer.json",
    ):
        assert (out / "policy" / name).read_bytes() == (tmp_path / "source" / "policy" / name).read_bytes(), name
    a = load_file(str(tmp_path / "source" / "policy" / "model.safetensors"))
    b = load_file(str(out / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    saved = json.loads((out / "train_config.json").read_text())  # what the run was: recorded truthfully
    assert saved["policy"]["pretrained_path"] == source and saved["policy"]["optimizer_lr"] == 1e-9
    assert saved["tokenizer"] == {**saved["tokenizer"], "type": "fast", "pretrained_path": f"{source}/action_tokenizer"}
    assert json.loads((out / "policy" / "config.json").read_text())["time_horizon"] == 4  # the saved policy's
    # the same command resumes it (the folder's config is rebuilt the same way)
    assert (
        main(
            [
                "train",
                f"--policy.path={source}",
                f"--dataset_root={tiny_dataset_root}",
                f"--output_dir={out}",
                "--policy.optimizer_lr=1e-9",
                "--policy.scheduler_decay_lr=0",
                *FINETUNE[:-1],
                "--steps=4",
                "--resume=true",
            ]
        )
        == 0
    )


def test_finetuning_refuses_what_the_saved_policy_cannot_take(tiny_dataset_root, tmp_path, capsys):
    from vla.cli import main
    from vla.sim.record import record

    source = train.main(config(tiny_dataset_root, tmp_path / "source", steps=2))["policy_path"]
    toy = tmp_path / "toy"  # another robot: a 2-D state and 2-D actions
    record("toy/obstacle", 2, toy, progress=False)
    out = tmp_path / "finetuned"
    cases = [
        (
            [f"--dataset_root={toy}"],
            f"the policy at {source} reads and writes 4-D actions, 39-D state, but {toy} has "
            "2-D actions, 2-D state; fine-tune it on data of the same robot",
        ),
        (
            [f"--dataset_root={tiny_dataset_root}", "--policy.time_horizon=6"],
            f"the policy at {source} was trained with other settings than the config given (time_horizon: 4 -> 6)",
        ),
        (
            [f"--dataset_root={tiny_dataset_root}", "--tokenizer.type=bin"],
            "--tokenizer.type does not apply with --policy.path: fine-tuning keeps the policy's own tokenizer",
        ),
    ]
    for args, expected in cases:
        assert main(["train", f"--policy.path={source}", f"--output_dir={out}", *args, *FINETUNE]) == 1
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err
        assert not out.exists()  # refused before anything was written
    assert (
        main(
            [
                "train",
                f"--policy.path={tmp_path / 'source'}",
                f"--dataset_root={tiny_dataset_root}",
                f"--output_dir={out}",
                *FINETUNE,
            ]
        )
        == 1
    )  # the run folder, not its policy/
    said = f"is a training run's folder, not a policy; did you mean --policy.path {tmp_path / 'source' / 'policy'}?"
    assert said in capsys.readouterr().err and not out.exists()


def test_the_last_lines_give_the_offline_verdict_and_the_next_step(tiny_dataset_root, tmp_path, capsys):
    """Through the CLI: a run shorter than its schedule is warned about before the first step, and its last lines say
    what the offline report found (the same verdict as offline_report.json) and what to do next."""
    from vla.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                f"--dataset_root={tiny_dataset_root}",
                f"--output_dir={out}",
                "--steps=2",
                "--batch_size=4",
                "--policy.preset=micro",
                "--policy.time_horizon=4",
                "--policy.n_action_steps=2",
                "--policy.scheduler_warmup_steps=1",
                "--policy.scheduler_decay_steps=40",
                "--policy.device=cpu",
                "--heldout_episodes=0.25",
                "--eval_chunks=8",
                "--report_chunks=16",
                "--progress=false",
                "--tokenizer.type=bin",
                "--tokenizer.n_bins=32",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    warning = (
        "WARNING: --steps=2 ends before the learning-rate schedule has decayed (policy.scheduler_decay_steps="
        "40): its last step runs at 99% of the peak learning rate; pass --policy.scheduler_decay_steps=2 to "
        "decay within the run"
    )  # warmed up over 1 step, then 2 of 40 steps of cosine decay
    assert warning in lines and lines.index(warning) < lines.index(f"report in {out / 'offline_report.md'}")
    report = json.loads((out / "offline_report.json").read_text())
    said = {True: "yes", False: "no"}
    verdict = next(line for line in lines if line.startswith("offline verdict: "))
    rmse = report["policy"]["rmse"]
    assert f"beats the mean action: {said[report['beats_mean_action']]} ({rmse:.3f} vs " in verdict
    hold = report["beats_hold_state"]
    assert (
        f"beats holding the state: {said[hold]} ("
        if hold is not None
        else f"holding the state: not defined ({report['hold_state_undefined_because']})"
    ) in verdict
    assert verdict.endswith("held-out RMSE, normalised, 1 held-out episode (a noisy verdict)")
    assert lines[-1].startswith("next: ") and lines[-1].endswith(  # the next step is the last line
        "; and set --policy.scheduler_decay_steps to the run's steps (it had not decayed by step 2)"
    )
    final = next(i for i, line in enumerate(lines) if line.startswith("final loss "))
    assert final < lines.index(verdict) and (out / "policy" / "config.json").is_file()
    lr = next(line for line in lines if line.startswith("learning rate at the end: "))
    assert lr.endswith(
        "of its peak: the schedule decays over 40 steps (policy.scheduler_decay_steps) and the run stopped at 2"
    )


def test_the_next_step_follows_the_verdict(tmp_path):
    cfg = TrainConfig(dataset_root="data", output_dir=str(tmp_path))
    base = {"mean_action": {"rmse": 0.64}, "hold_state": {"rmse": 0.276}}
    report = {
        "policy": {"rmse": 0.35},
        "baselines": base,
        "heldout_episodes": [3],
        "beats_mean_action": True,
        "beats_hold_state": False,
    }
    lines = train.final_lines(report, RunFolder(tmp_path), cfg, 300, 1e-3, 1e-3, 300)
    assert lines == [
        "offline verdict: beats the mean action: yes (0.350 vs 0.640); beats holding the state: no (0.350 "
        "vs 0.276); held-out RMSE, normalised, 1 held-out episode (a noisy verdict)",
        "next: train longer (--steps=600) or record more episodes; a policy that does not beat holding "
        "the state will mostly stand still on the robot",
    ]
    good = {**report, "policy": {"rmse": 0.2}, "beats_hold_state": True, "heldout_episodes": [1, 2, 3]}
    assert train.final_lines(good, RunFolder(tmp_path), cfg, 300, 1e-4, 1e-3, 300)[-1] == (
        f"next: run it: vla serve --policy {tmp_path / 'policy'} (on a robot), or vla eval --policy "
        f"{tmp_path / 'policy'} (in a simulator)"
    )
    assert train.final_lines(None, RunFolder(tmp_path), cfg, 300, 1e-4, 1e-3, 300) == [
        "offline verdict: none, no episode was held out; pass --heldout_episodes=0.1 to measure the policy against the "
        "mean action and holding the state"
    ]


def test_the_tokenizers_choices_from_the_data_are_said_and_kept_through_a_resume(tiny_dataset_root, tmp_path, capsys):
    auto = tokenizer_config("fast")  # vocab_size "auto": chosen from the training chunks
    train.main(config(tiny_dataset_root, tmp_path, steps=2, tokenizer=auto))
    out = capsys.readouterr().out
    tok = at.load_tokenizer(tmp_path / "policy" / "action_tokenizer")
    assert f"chose tokenizer.vocab_size = {tok.vocab_size}: " in out and "chose tokenizer.alphabet = " in out
    chosen = json.loads((tmp_path / "train_config.json").read_text())["chosen"]
    assert chosen["tokenizer.vocab_size"].startswith(f"{tok.vocab_size}: the ")
    train.main(config(tiny_dataset_root, tmp_path, steps=4, tokenizer=auto, resume=True))  # the same settings
    assert json.loads((tmp_path / "train_config.json").read_text())["chosen"] == chosen
    assert "chose tokenizer." not in capsys.readouterr().out  # a resumed run fits nothing
