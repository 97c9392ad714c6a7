"""Committed-prefix conditioning (``VLAConfig.commit_condition``): the committed actions shown beside the state, sampled
from each training chunk's own first actions, read from the request at inference."""

from __future__ import annotations

import action_tokenizers as at
import numpy as np
import pytest
import torch

from vla.execution import COMMITTED
from vla.policy.pipeline import COMMITTED_INPUT, AppendCommitted, RelativeActions, ShowCommitted

N, T, D = 3, 5, 2


def test_training_rows_show_none_or_their_own_first_actions_as_many_as_their_digest_says():
    chunks = np.random.default_rng(0).uniform(-1, 1, (400, T, D))
    step = ShowCommitted(N, D, T, sample=True)
    out = step({"task": ["push"] * 400, "action": chunks})[COMMITTED_INPUT]
    # the same chunk shows the same actions in any batch, any worker, after any resume
    again = step({"task": ["push"] * 3, "action": chunks[[7, 0, 7]]})[COMMITTED_INPUT]
    np.testing.assert_array_equal(again, out[[7, 0, 7]])
    assert out.shape == (400, N * D + N) and out.dtype == np.float32
    values, mask = out[:, : N * D].reshape(400, N, D), out[:, N * D :]
    shown = mask.sum(axis=1).astype(int)
    counts = np.bincount(shown, minlength=N + 1)
    assert 160 < counts[0] < 240 and all(counts[1:] > 40)  # none for about half the rows, then every d in 1..n
    for r in range(400):  # the mask is a prefix, the values the chunk's own first actions, zeros after
        d = shown[r]
        assert np.all(mask[r, :d] == 1) and np.all(mask[r, d:] == 0)
        np.testing.assert_allclose(values[r, :d], chunks[r, :d], rtol=1e-6)
        assert np.all(values[r, d:] == 0)


def test_a_request_shows_its_committed_actions_relative_and_normalised_and_none_without():
    normalizer = at.Normalizer("quantile", offset=np.array([1.0, -1.0]), scale=np.array([2.0, 4.0]))
    relative = RelativeActions(mask=(True, False), action_state_dims=(1, 0))
    show = ShowCommitted(N, D, T, action=normalizer, relative=relative)
    state = np.array([[10.0, 20.0], [0.0, 0.0]])
    committed = [np.array([[21.0, 5.0], [23.0, 9.0], [25.0, 1.0], [99.0, 99.0]]), np.zeros((0, D))]
    out = show({"task": ["a", "b"], "observation.state": state, COMMITTED: committed})[COMMITTED_INPUT]
    values, mask = out[:, : N * D].reshape(2, N, D), out[:, N * D :]
    # row 0: dim 0 relative to state dim 1 (20), then normalised; more than n cut to the first n
    expected = normalizer.normalize(committed[0][:N] - np.array([20.0, 0.0]))
    np.testing.assert_allclose(values[0], expected, rtol=1e-6)
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]] and np.all(values[1] == 0)
    for bad, why in (([np.full((1, D), np.nan), committed[1]], "finite"), (committed[:1], "one per row")):
        with pytest.raises(ValueError, match=why):
            show({"task": ["a", "b"], "observation.state": state, COMMITTED: bad})
    bare = show({"task": ["a"], "observation.state": state[:1]})[COMMITTED_INPUT]
    assert np.all(bare == 0)  # no request committed anything: the episode's first chunk
    appended = AppendCommitted()({"observation.state": torch.ones(2, 4), COMMITTED_INPUT: out})["observation.state"]
    assert appended.shape == (2, 4 + N * D + N) and torch.equal(appended[:, 4:], torch.as_tensor(out))


def test_a_conditioned_policy_trains_saves_loads_and_reads_what_it_is_sent(tiny_dataset_root, tmp_path):
    from vla import evaluate, train
    from vla.policy import VLAConfig, VLAPolicy
    from vla.sim import make_env
    from vla.tokenizer_choice import tokenizer_config

    cfg = train.TrainConfig(
        dataset_root=str(tiny_dataset_root),
        output_dir=str(tmp_path / "run"),
        tokenizer=tokenizer_config("fast", vocab_size=256),
        steps=2,
        batch_size=4,
        save_every=2,
        log_every=1,
        progress=False,
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, device="cpu", commit_condition=2),
    )
    path = train.main(cfg)["policy_path"]
    policy = VLAPolicy.from_pretrained(path).eval()
    assert policy.config.commit_condition == 2 and policy.commit_scheme == "conditioned"
    assert not any(isinstance(s, ShowCommitted) and s.sample for s in policy.pipeline.measuring)
    with make_env("metaworld/push-v3") as env:
        obs = env.reset(evaluate.EVAL_SEED_START)
    runner = evaluate.ChunkPolicy(policy)
    normalized = np.random.default_rng(0).uniform(-0.9, 0.9, (3, 4))
    committed = policy.action_normalizer.unnormalize(normalized)  # d = 3: cut to the 2 the policy reads
    steps = dict(policy.pipeline.step_through({**runner.batch([obs]), COMMITTED: [committed]}, "prompt"))
    state = steps["AppendCommitted"]["observation.state"]  # what the state encoder reads, beside the state
    np.testing.assert_allclose(np.asarray(state)[0, -(2 * 4 + 2) :], [*normalized[:2].ravel(), 1, 1], atol=1e-5)
    chunks = runner([{**obs, COMMITTED: committed}, obs])
    assert chunks.shape == (2, 4, 4) and np.isfinite(chunks).all()
    report = evaluate.evaluate(
        path,
        "metaworld/push-v3",
        episodes=1,
        max_steps=8,
        delay_ms=25,
        decode_ms=0,
        ahead=True,
        commit=True,
        progress=False,
    )
    assert report["request"] == "ahead, with the committed actions" and report["valid_chunk_rate"] == 1.0


def test_conditioning_needs_the_state_as_embeddings():
    from vla.policy import VLAConfig

    with pytest.raises(ValueError, match="commit_condition"):
        VLAConfig(preset="micro", commit_condition=2, state_encoding="text")
    with pytest.raises(ValueError, match="commit_condition"):
        VLAConfig(preset="micro", commit_condition=-1)


def test_a_policy_refuses_to_condition_on_more_actions_than_a_chunk_or_without_a_state():
    from tests.test_policy import T as POLICY_T
    from tests.test_policy import make_policy

    assert make_policy("bin", commit_condition=POLICY_T).commit_scheme == "conditioned"  # bin too: not forced
    with pytest.raises(ValueError, match="more actions than a chunk"):
        make_policy("bin", commit_condition=POLICY_T + 1)
    with pytest.raises(ValueError, match="reads no state"):
        make_policy("bin", commit_condition=2, state_dim=0)
