"""Saved tokenizers and policies that loaded and then acted wrongly, reproduced: each is now refused on load (or at
fit) with one line naming the file, the value and the fix, and nothing is written, lost or sent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import action_tokenizers as at
import numpy as np
import pytest
import torch
from action_tokenizers.synthetic import smooth_chunks
from safetensors.torch import load_file, save_file

from tests.conftest import train_micro_policy
from vla.cli import main
from vla.policy import VLAPolicy


@pytest.fixture(scope="module")
def saved_policy(tiny_dataset_root, tmp_path_factory):
    return train_micro_policy(tiny_dataset_root, tmp_path_factory.mktemp("saved"))


def copy_of(saved_policy, tmp_path):
    folder = tmp_path / "policy"
    shutil.copytree(saved_policy, folder)
    return folder


def snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused_by_inspect(capsys, folder, tmp_path) -> str:
    """``vla inspect`` on ``folder``: exit 1, one line on stderr, no output folder, ``folder`` untouched."""
    before = snapshot(folder)
    assert main(["inspect", "--policy", str(folder), "--out", str(tmp_path / "inspect")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla inspect:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "inspect").exists() and snapshot(folder) == before
    return err


# --- 1. a normaliser that sends inf to a robot ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        (1e300, "scale 1e+300 (dimension 0) is beyond +-1e+09 (MAX_STATISTIC)"),
        (0.0, "scale 0 (dimension 0) is below 1e-08"),
    ],
)
def test_a_normaliser_scale_of_1e300_or_0_is_refused_on_load(saved_policy, tmp_path, capsys, scale, expected):
    folder = copy_of(saved_policy, tmp_path)
    path = folder / "action_normalizer.json"
    data = json.loads(path.read_text())
    data["scale"][0] = scale
    path.write_text(json.dumps(data))
    err = refused_by_inspect(capsys, folder, tmp_path)
    assert str(path) in err and expected in err, err


def test_a_chunk_that_overflows_once_unnormalised_is_never_returned(saved_policy, caplog):
    """Should a normaliser overflow anyway (here set in memory, past every check), the chunk is not sent: it falls
    back like an invalid decode, counted, and every value returned is finite."""
    policy = VLAPolicy.from_pretrained(saved_policy)
    norm = policy.action_normalizer
    object.__setattr__(norm, "scale", np.full_like(norm.scale, 1e300))
    obs = {"observation.state": torch.zeros(2, policy.config.state_dim), "task": ["push", "push"]}
    chunk = policy.predict_action_chunk(obs)
    assert torch.isfinite(chunk).all()
    info = policy.last_decode_info
    assert not info.valid.any() and "not finite once unnormalised" in info.errors[0]
    assert policy.decode_stats.invalid == 2 and policy.decode_stats.fallback_zero == 2
    assert torch.equal(chunk[0, 0], torch.as_tensor(norm.offset, dtype=torch.float32))  # the middle of the range


# --- 2. weights of the wrong dtype, a BEAST bound of 1e308 ------------------------------------------------------------
def test_int8_policy_weights_are_refused_naming_the_tensor(saved_policy, tmp_path, capsys):
    folder = copy_of(saved_policy, tmp_path)
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    save_file({k: v.to(torch.int8) if v.is_floating_point() else v for k, v in weights.items()}, str(path))
    err = refused_by_inspect(capsys, folder, tmp_path)
    assert f"{path}: tensor " in err and " is I8 but the model holds float32 there" in err, err
    assert "use the policy as vla saved it" in err


def test_int8_fsq_weights_are_refused_naming_the_tensor(tmp_path):
    tok = at.FSQTokenizer.fit(smooth_chunks(64, 4, 2, seed=0), hidden=8, depth=0, steps=2, show_progress=False)
    path = tok.save_pretrained(tmp_path / "tok") / "model.safetensors"
    weights = load_file(str(path))
    save_file({k: v.to(torch.int8) if v.is_floating_point() else v for k, v in weights.items()}, str(path))
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"model.safetensors: tensor '.*' is I8 but the model holds float32") as err:
        at.load_tokenizer(tmp_path / "tok")
    assert "\n" not in str(err.value) and path.read_bytes() == before


# --- 3. sizes read from files, or given to fit ------------------------------------------------------------------------
def _tokenizer(name):
    chunks = smooth_chunks(64, 8, 2, seed=0)
    if name == "fsq":
        return at.FSQTokenizer.fit(chunks, hidden=8, depth=0, steps=2, show_progress=False)
    return at.get_tokenizer_class(name).fit(chunks, **({"n_control_points": 4, "degree": 2} if name == "beast" else {}))


@pytest.mark.parametrize(
    ("name", "field", "value", "expected"),
    [
        ("bin", "n_bins", 10**15, "field 'n_bins' is 1000000000000000, beyond its bound 65536 (MAX_N_BINS)"),
        ("bin", "time_horizon", 10**9, "beyond its bound 1024 (MAX_TIME_HORIZON)"),
        ("beast", "n_bins", 10**12, "n_bins 1000000000000 is above the bound 65536 (MAX_N_BINS)"),
        ("beast", "bound", 1e308, "bound must be a positive number of at most 1000 (MAX_BOUND"),
        ("fsq", "hidden", 10**6, "hidden 1000000 is above the bound 4096 (MAX_HIDDEN)"),
        ("fsq", "levels", [1000, 1000], "make 1000000 codes, above the bound 65536 (MAX_VOCAB_SIZE)"),
        ("fast", "min_token", 10**30, "min_token must be an integer within +-1048576 (MAX_MIN_TOKEN)"),
        ("fast", "scale", 1e300, "scale must be a number in [0.001, 10000] (SCALE_RANGE)"),
    ],
)
def test_sizes_in_a_saved_tokenizer_are_bounded_on_load(tmp_path, name, field, value, expected):
    folder = _tokenizer(name).save_pretrained(tmp_path / "tok")
    path = folder / "action_tokenizer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    before = snapshot(folder)
    with pytest.raises(ValueError) as err:
        at.load_tokenizer(folder)
    assert str(folder) in str(err.value) and expected in str(err.value) and "\n" not in str(err.value)
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        ("bin", {"n_bins": 2 * 10**9}, "n_bins 2000000000 is above the bound 65536 (MAX_N_BINS); use at most 65536"),
        ("beast", {"n_bins": 10**12}, "n_bins 1000000000000 is above the bound 65536 (MAX_N_BINS)"),
        ("beast", {"bound": 1e308}, "(MAX_BOUND"),
        ("fsq", {"hidden": 10**6}, "hidden 1000000 is above the bound 4096 (MAX_HIDDEN)"),
        ("fsq", {"threads": 10**9}, "threads 1000000000 is above the bound 256 (MAX_THREADS)"),
        ("fast", {"vocab_size": 10**12}, "vocab_size 1000000000000 is above the bound 65536 (MAX_VOCAB_SIZE)"),
        ("fast", {"scale": 1e300}, "(SCALE_RANGE)"),
    ],
)
def test_sizes_given_to_fit_are_bounded(name, options, expected):
    with pytest.raises(ValueError) as err:
        at.get_tokenizer_class(name).fit(smooth_chunks(64, 10, 2, seed=0), **options)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_vla_tokenizer_fit_bounds_its_options(tiny_dataset_root, tmp_path, capsys):
    out = tmp_path / "tok"
    argv = ["tokenizer", "fit", "--root", str(tiny_dataset_root), "--type", "bin", "--out", str(out)]
    assert main([*argv, "--option", "n_bins=1000000000000000"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla tokenizer:") and len(err.splitlines()) == 1, err
    assert "n_bins 1000000000000000 is above the bound 65536 (MAX_N_BINS); use at most 65536" in err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, not even a temporary folder


@pytest.mark.parametrize(
    ("field", "bound"), [("max_action_tokens", 8192), ("image_size", 1024), ("time_horizon", 1024)]
)
def test_sizes_in_a_saved_policy_config_are_bounded(saved_policy, tmp_path, capsys, field, bound):
    folder = copy_of(saved_policy, tmp_path)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: 10**9}))
    err = refused_by_inspect(capsys, folder, tmp_path)
    expected = f"VLAConfig.{field} = 1000000000 is invalid: use at most {bound} (its bound in SIZE_BOUNDS)"
    assert str(path) in err and expected in err, err


# --- 4. fine-tuning at another frame rate; a tokenizer that is not the policy's ---------------------------------------
def test_finetuning_at_another_fps_is_refused_naming_the_override(saved_policy, tiny_dataset_root, tmp_path, capsys):
    from vla.data import reader
    from vla.policy.factory import check_finetuning
    from vla.train_cli import parse_args

    assert json.loads(Path(saved_policy, "config.json").read_text())["fps"] == 80  # recorded by vla train
    data = tmp_path / "data40"
    shutil.copytree(tiny_dataset_root, data)
    info_path = data / "meta" / "info.json"
    info_path.write_text(json.dumps({**json.loads(info_path.read_text()), "fps": 40}))
    out = tmp_path / "finetuned"
    argv = ["train", f"--policy.path={saved_policy}", f"--dataset_root={data}", f"--output_dir={out}", "--steps=2"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"the policy at {saved_policy} was trained on 80 fps data but {data} is 40 fps" in err
    assert "its 4-step chunks would span 0.1 s instead of 0.05 s" in err and "pass --policy.fps=40" in err
    assert not out.exists()
    # the override named is taken: the same check passes, and the policy then records 40 fps
    cfg = parse_args(argv[1:] + ["--policy.fps=40"])
    check_finetuning(cfg, reader.dataset_info(data))
    assert cfg.policy.fps == 40


def test_a_policy_saved_before_fps_was_recorded_still_loads(saved_policy, tmp_path):
    folder = copy_of(saved_policy, tmp_path)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    del config["fps"]
    path.write_text(json.dumps(config))
    assert VLAPolicy.from_pretrained(folder).config.fps is None


def test_a_tokenizer_of_another_size_names_the_right_fix(saved_policy, tmp_path, capsys):
    folder = copy_of(saved_policy, tmp_path)
    saved = at.load_tokenizer(folder / "action_tokenizer")
    other = at.BinningTokenizer.fit(smooth_chunks(8, saved.time_horizon, saved.action_dim, seed=0), n_bins=64)
    other.save_pretrained(folder / "action_tokenizer")
    err = refused_by_inspect(capsys, folder, tmp_path)
    expected = f"the policy's embedding table holds {saved.vocab_size} action ids but its bin action tokenizer has 64"
    assert expected in err, err
    assert "Load the policy with the tokenizer it was saved with" in err and "VocabMap.paligemma" not in err, err
