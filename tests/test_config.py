from pathlib import Path

import action_tokenizers as at
import pytest

from vla.config import TrainConfig, load_config
from vla.policy import VLAConfig
from vla.tokenizer_choice import TOKENIZER_CONFIGS, tokenizer_config

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    names = {p.stem for p in CONFIGS}
    assert {"debug", "fast", "bin", "fsq", "images", "paligemma-3b"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_parses(path):
    cfg = load_config(str(path))
    assert isinstance(cfg, TrainConfig)
    assert cfg.tokenizer.type in at.TOKENIZERS
    assert 1 <= cfg.policy.n_action_steps <= cfg.policy.time_horizon


def test_overrides_with_a_choice_type():
    cfg = load_config("configs/debug.yaml", ["--tokenizer.type=fsq", "--tokenizer.steps=7", "--steps=3"])
    assert isinstance(cfg.tokenizer, TOKENIZER_CONFIGS["fsq"]) and cfg.tokenizer.steps == 7 and cfg.steps == 3
    assert isinstance(load_config("configs/debug.yaml").tokenizer, TOKENIZER_CONFIGS["fast"])


def test_another_tokenizer_type_drops_the_files_tokenizer_options(tmp_path):
    """configs/aloha.yaml sets FAST's scale; --tokenizer.type=beast gives BEAST, its options from the command line or
    its defaults, and keeps the rest of the file (whether the file comes as an argument or as --config_path)."""
    for path, args in (
        ("configs/aloha.yaml", []),
        (None, ["--config_path", "configs/aloha.yaml"]),
        (None, ["--config_path=configs/aloha.yaml"]),
    ):
        cfg = load_config(path, [*args, "--tokenizer.type=beast", "--tokenizer.n_control_points=7"])
        assert isinstance(cfg.tokenizer, TOKENIZER_CONFIGS["beast"]) and cfg.tokenizer.n_control_points == 7
        assert cfg.policy.time_horizon == 50 and cfg.steps == 4000  # the file's other settings
    assert load_config("configs/aloha.yaml", ["--tokenizer.type=bin"]).tokenizer == tokenizer_config("bin")
    same = load_config("configs/aloha.yaml", ["--tokenizer.type=fast", "--tokenizer.scale=20"])
    assert same.tokenizer.scale == 20 and same.policy.time_horizon == 50
    with pytest.raises(ValueError, match="scale"):  # the file's own type keeps draccus' check of its options
        bad = tmp_path / "bad.yaml"
        bad.write_text("tokenizer:\n  type: beast\n  scale: 3.0\n")
        load_config(str(bad), ["--tokenizer.type=beast"])


def test_a_tokenizer_option_alone_sets_the_default_tokenizers_option(tmp_path):
    """With no config file (vla train --dataset_root=DIR) or a file without a tokenizer section, one of FAST's options
    on its own sets it on the default tokenizer, where draccus would refuse a tokenizer section without its type."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("steps: 5\n")
    for path in (None, str(bare)):
        cfg = load_config(path, [f"--dataset_root={tmp_path}", "--tokenizer.vocab_size=128"])
        assert isinstance(cfg.tokenizer, TOKENIZER_CONFIGS["fast"]) and cfg.tokenizer.vocab_size == 128
        assert (
            load_config(path, [f"--dataset_root={tmp_path}", "--tokenizer.vocab_size=null"]).tokenizer.vocab_size
            is None
        )
    with pytest.raises(ValueError, match="n_bins"):  # still FAST: a binning option is named as no field of it
        load_config(None, [f"--dataset_root={tmp_path}", "--tokenizer.n_bins=64"])


def test_a_saved_tokenizer_alone_names_its_type(tmp_path):
    """``--tokenizer.pretrained_path`` without a type loads what is saved there (binning here), not the default."""
    saved = tmp_path / "tok"
    at.BinningTokenizer.unfitted(4, 2).save_pretrained(saved)
    assert at.saved_type(saved) == "bin"
    cfg = load_config(None, [f"--dataset_root={tmp_path}", f"--tokenizer.pretrained_path={saved}"])
    assert cfg.tokenizer.type == "bin" and cfg.tokenizer.load().name == "bin"
    with pytest.raises(ValueError, match="no tokenizer directory"):
        load_config(None, [f"--dataset_root={tmp_path}", f"--tokenizer.pretrained_path={tmp_path / 'none'}"])


def test_tokenizer_choices_are_the_librarys_registry():
    """One registry: every registered tokenizer is a config choice with the fields and defaults of its Options."""
    import dataclasses

    assert set(TOKENIZER_CONFIGS) == set(at.TOKENIZERS)
    for name, cls in at.TOKENIZERS.items():
        choice = tokenizer_config(name)
        assert choice.type == name
        assert choice.options() == dataclasses.asdict(cls.Options())


def test_policy_config_is_the_one_config(tiny_dataset_root, tmp_path):
    """The policy a run builds is the one the training config carries (LeRobot's VLAConfig, no copy in between)."""
    from vla.data import reader
    from vla.policy.factory import build_policy

    cfg = load_config(
        "configs/fast.yaml",
        [
            "--policy.time_horizon=8",
            "--policy.n_action_steps=4",
            "--policy.preset=micro",
            f"--dataset_root={tiny_dataset_root}",
        ],
    )
    info = reader.dataset_info(tiny_dataset_root)
    policy = build_policy(cfg.resolved(info, log=None), info, list(range(info.num_episodes)))
    assert type(policy.config) is VLAConfig and policy.config.time_horizon == 8 and policy.config.n_action_steps == 4
    assert policy.action_tokenizer.time_horizon == 8  # fitted on chunks of the config's length


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, "steps must be"),
        ({"ema_decay": 1.0}, "ema_decay"),
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"log_every": 0}, "log_every"),
    ],
)
def test_validation_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_mixed_precision_no_on_the_command_line_is_no():
    assert load_config(None, ["--dataset_root=d", "--mixed_precision=no"]).mixed_precision == "no"  # not YAML's false
    assert load_config(None, ["--dataset_root=d", "--mixed_precision=bf16"]).mixed_precision == "bf16"


def test_one_tokenizer_choice_for_train_compare_fit_and_lerobot():
    """`--tokenizer.type=bin --tokenizer.n_bins=32`, `vla compare --tokenizers bin:n_bins=32` and LeRobot's
    `--policy.action_tokenizer_type=bin:n_bins=32` name the same choice, and fit the same tokenizer."""
    import numpy as np

    from vla.compare import parse_entry
    from vla.tokenizer_choice import parse_choice

    cfg = load_config(None, ["--dataset_root=d", "--tokenizer.type=bin", "--tokenizer.n_bins=32"])
    assert parse_choice("bin:n_bins=32") == cfg.tokenizer == parse_entry("bin:n_bins=32").choice
    assert parse_choice("fsq:levels=[8,5,5]").levels == [8, 5, 5]
    chunks = np.random.default_rng(0).uniform(-1, 1, (64, 8, 3))
    a, b = cfg.tokenizer.fit(chunks), parse_entry("bin:n_bins=32").fit(chunks)
    assert a.vocab_size == b.vocab_size == 32 and a.encode(chunks[:4]) == b.encode(chunks[:4])
    assert VLAConfig(action_tokenizer_type="beast:n_control_points=6").action_tokenizer_type.startswith("beast")
    with pytest.raises(ValueError, match="did you mean 'n_bins'"):
        VLAConfig(action_tokenizer_type="bin:nbins=32")
    with pytest.raises(ValueError, match="write options as name:option=value"):
        parse_choice("bin:n_bins")


# --- a new user's first commands, from a folder outside the clone ---------------------------------------------------
def test_train_with_no_dataset_and_no_config_refuses_when_the_default_is_absent(tmp_path, monkeypatch, capsys):
    from vla.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps=2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vla train: error: no --dataset_root given (no config file was given), and the default "
        "outputs/datasets/metaworld_push-v3 (the demo's push-v3 recording) is not here; pass "
        "--dataset_root=DIR (a LeRobot v3.0 dataset), or record the default with vla data record --task "
        "push-v3 --episodes 100"
    ]
    assert list(tmp_path.iterdir()) == []  # no run folder, nothing written


def test_train_says_which_dataset_it_uses_when_none_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "datasets" / "metaworld_push-v3").mkdir(parents=True)
    lines = []
    assert load_config(args=["--steps=2"], log=lines.append).dataset_root == "outputs/datasets/metaworld_push-v3"
    assert lines == [
        "dataset_root = outputs/datasets/metaworld_push-v3: the default, no --dataset_root given (no "
        "config file was given); pass --dataset_root=DIR for your own"
    ]
    lines.clear()
    load_config(args=["--config_path", "configs/fast.yaml"], log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("dataset_root = outputs/datasets/metaworld_push-v3: the default")
    assert "configs/fast.yaml names none" in lines[0]
    lines.clear()
    load_config(args=["--config_path=aloha", "--steps=2"], log=lines.append)  # aloha.yaml names its dataset
    load_config(args=["--dataset_root=d"], log=lines.append)
    assert lines == []


@pytest.mark.parametrize("name", ["configs/fast.yaml", "fast.yaml", "fast", "vla/configs/fast.yaml"])
def test_a_shipped_config_is_found_by_name_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(args=[f"--config_path={name}", "--dataset_root=d"], log=None)
    assert cfg.output_dir == "outputs/train/fast" and cfg.tokenizer.scale == 10.0


def test_the_configs_an_installed_wheel_carries_are_found(tmp_path, monkeypatch):
    """pyproject.toml ships configs/ as vla/configs inside the wheel; outside a checkout that copy is the one found."""
    from vla.config import find_config

    monkeypatch.chdir(tmp_path)
    package = tmp_path / "site-packages" / "vla"
    (package / "configs").mkdir(parents=True)
    (package / "configs" / "fast.yaml").write_text("steps: 7\n")
    assert find_config("configs/fast.yaml", here=package) == str(package / "configs" / "fast.yaml")
    assert "vla/configs" in (Path(__file__).parents[1] / "pyproject.toml").read_text()


def test_an_unknown_config_names_the_shipped_ones(tmp_path, monkeypatch, capsys):
    from vla.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config_path", "configs/fsat.yaml", "--dataset_root=d"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "vla train: error: no config file 'configs/fsat.yaml'; did you mean 'fast'? (the shipped configs, in "
    )
    assert "aloha, beast, bin, debug, fast, fsq" in err[0] and err[0].endswith(
        "pass one by name (--config_path fast) or a path to your own YAML file"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_misspelled_train_flag_is_one_line_with_the_closest(tmp_path, monkeypatch, capsys):
    from vla.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--datset_root=d", f"--output_dir={tmp_path / 'run'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vla train: error: unknown option --datset_root; did you mean '--dataset_root'? (vla train --help "
        "lists every option)"
    ]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="unknown option --policy.time_horizn; did you mean '--policy.time_horizon'"):
        load_config(args=["--dataset_root=d", "--policy.time_horizn=4"])
    # the other spelling of a known flag is that flag, as for every other command
    flags = ["--dataset-root=d", "--policy.time-horizon=4", "--tokenizer.type=bin", "--tokenizer.n-bins=8"]
    cfg = load_config(args=flags)
    assert (cfg.dataset_root, cfg.policy.time_horizon, cfg.tokenizer.n_bins) == ("d", 4, 8)
