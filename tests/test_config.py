from pathlib import Path

import pytest

from vla.config import FASTConfig, FSQConfig, PolicyOptions, TrainConfig, load_config

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    names = {p.stem for p in CONFIGS}
    assert {"debug", "fast", "bin", "fsq", "images", "paligemma-3b"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_parses(path):
    cfg = load_config(str(path))
    assert isinstance(cfg, TrainConfig)
    assert cfg.tokenizer.type in ("fast", "bin", "fsq")
    assert 1 <= cfg.policy.n_action_steps <= cfg.policy.time_horizon


def test_overrides_with_a_choice_type():
    cfg = load_config("configs/debug.yaml", ["--tokenizer.type=fsq", "--tokenizer.steps=7", "--steps=3"])
    assert isinstance(cfg.tokenizer, FSQConfig) and cfg.tokenizer.steps == 7 and cfg.steps == 3
    assert isinstance(load_config("configs/debug.yaml").tokenizer, FASTConfig)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, "steps must be"),
        ({"ema_decay": 1.0}, "ema_decay"),
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"policy": PolicyOptions(state_encoding="float")}, "state_encoding must be one of text, embedding"),
    ],
)
def test_validation_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)
