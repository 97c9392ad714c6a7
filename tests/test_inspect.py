"""``vla inspect``: the pictures and the summary for one sample, from a dataset and made up."""

from __future__ import annotations

import action_tokenizers as at
import numpy as np
import pytest

from tests.conftest import D, T, assert_plot, fitted_tokenizers
from vla.policy import VLAConfig, VLAPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def policy(name: str, state_dim: int = 4, tokenizer: at.ActionTokenizer | None = None) -> VLAPolicy:
    config = VLAConfig(
        preset="micro",
        time_horizon=T,
        n_action_steps=2,
        device="cpu",
        init_seed=0,
        text_words=["Task:", ", State:", ";\n", "Action: ", " push"],
    )
    tokenizer = tokenizer or fitted_tokenizers()[name]
    return VLAPolicy(
        config,
        action_tokenizer=tokenizer,
        action_normalizer=at.Normalizer.identity(tokenizer.action_dim),
        state_normalizer=at.Normalizer.identity(state_dim),
    )


@pytest.mark.parametrize("name", ["fast", "bin"])
def test_inspect_draws_layout_mask_and_decoding(name, tmp_path):
    from vla.inspect import inspect_policy

    summary = inspect_policy(policy(name), tmp_path)
    for png in ("layout.png", "decoding.png"):
        assert_plot(tmp_path / png)
    assert_plot(tmp_path / "attention_mask.png", coloured=False)
    text = (tmp_path / "summary.txt").read_text()
    assert "CheckBatch" in text and "BuildSequence" in text and "'Task: push, State: " in text
    tokens = summary["tokens"]
    assert tokens["state"] == 1 and tokens["action"] >= 1 and tokens["suffix text"] >= 3  # "Action: ", "|", EOS
    # constrained greedy decoding ends with "|" once the chunk is complete
    length = fitted_tokenizers()[name].constraint(T, D).max_length
    assert 1 <= summary["decoding_steps"] <= length + 1


def test_token_kinds_mark_padding_and_the_mask_hides_it(tmp_path):
    from vla.inspect import KINDS, token_kinds

    pol = policy("fast")
    batch = {"observation.state": np.zeros((2, 4)), "task": ["push", "push the puck"], "action": np.zeros((2, T, D))}
    from vla.policy.pipeline import run

    seq = run(pol.pipeline.training, batch)["sequence"]
    kinds = token_kinds(pol, seq)
    padding = kinds == KINDS.index("padding")
    assert padding[0].any() and not padding[1].any()  # the shorter task is padded
    mask = seq.attention_mask.numpy()
    assert not mask[0][padding[0]].any() and not mask[0][:, padding[0]].any()


def test_inspect_on_a_dataset_sample_through_the_cli(tiny_dataset_root, tmp_path, capsys):
    from action_tokenizers.synthetic import smooth_chunks

    from vla.cli import main

    pol = policy("fast", state_dim=39, tokenizer=at.FASTTokenizer.fit(smooth_chunks(200, T, 4), vocab_size=256))
    pol.save_pretrained(tmp_path / "policy")
    assert (
        main(
            [
                "inspect",
                "--policy",
                str(tmp_path / "policy"),
                "--dataset",
                str(tiny_dataset_root),
                "--index",
                "3",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert "wrote layout.png" in capsys.readouterr().out
    assert (tmp_path / "out" / "attention_mask.png").is_file()
    assert (
        main(
            ["inspect", "--policy", str(tmp_path / "policy"), "--dataset", str(tiny_dataset_root), "--index", "100000"]
        )
        == 1
    )
    assert "outside the dataset" in capsys.readouterr().err


@pytest.mark.parametrize("name,decoding", [("fast", "autoregressive"), ("bin", "autoregressive"), ("bin", "parallel")])
def test_the_trace_is_the_policys_own_decoding(name, decoding):
    """vla inspect's steps come from the decoding loop itself: the ids it shows are the chunk the policy predicts."""
    import dataclasses

    import torch

    from vla.inspect import trace_decoding
    from vla.model.decode import generate
    from vla.policy.pipeline import SEQUENCE, run

    base = policy(name)
    pol = VLAPolicy(
        dataclasses.replace(base.config, decoding=decoding),
        action_tokenizer=base.action_tokenizer,
        action_normalizer=base.action_normalizer,
        state_normalizer=base.state_normalizer,
    )
    pol.eval()
    batch = {"observation.state": torch.zeros(1, 4), "task": ["push"]}
    steps = trace_decoding(pol, batch)
    ids = [s["action_id"] for s in steps if s["action_id"] >= 0]
    prompt = run(pol.pipeline.prompt, batch)
    gen = generate(
        pol.model,
        prompt[SEQUENCE],
        vocab=pol.vocab,
        constraint=pol.constraint,
        images=prompt.get("images"),
        max_new_tokens=pol.max_new_tokens,
    )
    assert ids == gen.ids[0]  # tracing changes nothing
    pol.predict_action_chunk(dict(batch))
    assert int(pol.last_decode_info.tokens_per_chunk[0]) == len(ids)
    chunk = pol.action_tokenizer.decode([ids], T, D)
    assert bool(chunk.valid[0]) and all(1 <= s["allowed"] and s["top"][0][0] == s["chosen"] for s in steps)
    if decoding == "parallel":
        assert len(steps) == len(ids)  # one step per query slot, no stop token
    else:
        assert steps[-1]["chosen"] == pol.vocab.end_id and len(steps) == len(ids) + 1


def test_a_policy_without_normalisers_is_refused_with_what_to_give():
    from lerobot.configs.types import FeatureType, PolicyFeature

    from vla.inspect import sample_of

    config = VLAConfig(preset="micro", time_horizon=T, device="cpu", action_tokenizer_type="bin")
    config.input_features = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(4,))}
    config.output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(D,))}
    with pytest.raises(ValueError, match="holds no normalisers"):
        sample_of(VLAPolicy(config), None, 0)
