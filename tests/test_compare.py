import json
import math

import numpy as np
import pytest

from tests.conftest import assert_plot
from vla import compare

KEYS = [
    "tokens_per_chunk_mean",
    "tokens_per_chunk_p99",
    "compression",
    "rmse",
    "mae",
    "max_abs",
    "encode_chunks_per_s",
    "decode_chunks_per_s",
    "vocab_used",
    "valid_rate_random",
    "valid_rate_constrained",
]


@pytest.fixture(scope="module")
def result(tiny_dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    res = compare.compare(
        tiny_dataset_root,
        out,
        tokenizers="fast fast:byte_level=true bin fsq beast:n_control_points=6",
        time_horizon=8,
        heldout=0.25,
        do_sweep=True,
        n_random=100,
        fit_options={"fsq": {"steps": 30, "hidden": 16, "depth": 0, "show_progress": False}},
        log=lambda _: None,
    )
    return res, out


def test_every_key_present_and_finite(result):
    res, out = result
    saved = json.loads((out / "compare.json").read_text())
    assert set(saved["tokenizers"]) == {"fast", "fast:byte_level=true", "bin", "fsq", "beast:n_control_points=6"}
    for name, row in saved["tokenizers"].items():
        for key in KEYS:
            assert key in row and math.isfinite(row[key]), (name, key)
    for png in ("rate_distortion.png", "per_dim_error.png", "token_lengths.png"):
        assert_plot(out / png)
    assert "| fast |" in (out / "compare.md").read_text()


def test_compression_is_values_per_id(result):
    rows = result[0]["tokenizers"]
    values = rows["bin"]["tokens_per_chunk_mean"]  # binning spells each value of a chunk with one id
    assert rows["bin"]["compression"] == 1.0
    assert rows["fast"]["compression"] == pytest.approx(values / rows["fast"]["tokens_per_chunk_mean"])
    assert rows["fast"]["compression"] > 1.5  # smooth chunks: BPE merges runs of DCT coefficients


def test_constrained_sequences_always_decode(result):
    for row in result[0]["tokenizers"].values():
        assert row["valid_rate_constrained"] == 1.0


def test_fast_error_falls_as_scale_rises(result):
    curve = result[0]["sweep"]["fast"]
    rmse = [p["rmse"] for p in sorted(curve, key=lambda p: p["scale"])]
    assert all(a >= b for a, b in zip(rmse, rmse[1:])) and rmse[0] > rmse[-1]
    tokens = [p["tokens_per_chunk_mean"] for p in sorted(curve, key=lambda p: p["scale"])]
    assert tokens[0] < tokens[-1]


def test_entries_are_registry_names_with_options():
    entry = compare.parse_entry("bin:n_bins=128")
    assert (entry.label, entry.name, entry.choice.n_bins) == ("bin:n_bins=128", "bin", 128)
    assert compare.parse_entry("fsq:levels=[8,5,5]").choice.levels == [8, 5, 5]
    assert set(compare.DEFAULT_TOKENIZERS) >= {"fast", "fast:byte_level=true", "bin", "fsq", "beast"}
    with pytest.raises(ValueError, match="unknown bin option 'nbins'.*did you mean 'n_bins'"):
        compare.parse_entry("bin:nbins=128")
    with pytest.raises(ValueError, match="option=value"):
        compare.parse_entry("bin:128")


def test_bad_input(tiny_dataset_root, tmp_path):
    with pytest.raises(ValueError, match="did you mean 'fsq'"):
        compare.compare(tiny_dataset_root, tmp_path, tokenizers="fqs")
    with pytest.raises(ValueError, match="longer than every episode"):
        compare.compare(tiny_dataset_root, tmp_path, tokenizers="bin", time_horizon=100_000)


def test_default_horizon_is_the_chunk_vla_train_chooses(tiny_dataset_root):
    from vla.config import load_config
    from vla.data import defaults
    from vla.data.reader import dataset_info

    info = dataset_info(tiny_dataset_root)
    messages = []
    t = compare.default_time_horizon(info, messages.append)
    trained = defaults.choose(load_config(args=[f"--dataset_root={tiny_dataset_root}"]), info)[0].policy.time_horizon
    expected = min(round(defaults.CHUNK_SECONDS * info.fps), int(np.max(info.episode_lengths)))
    assert t == trained == expected
    assert messages and "as vla train chooses it" in messages[0]


def test_compare_ends_with_a_recommendation_at_the_training_chunk(tiny_dataset_root, tmp_path, capsys):
    from vla.cli import main

    out = tmp_path / "cmp"
    argv = [
        "compare",
        "--dataset_root",
        str(tiny_dataset_root),
        "--out",
        str(out),
        "--tokenizers",
        "fast bin beast:n_control_points=6",
        "--episodes-heldout",
        "0.25",
    ]
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    saved = json.loads((out / "compare.json").read_text())
    rows, rec = saved["tokenizers"], saved["recommendation"]
    within = [k for k, r in rows.items() if r["rmse"] <= compare.MAX_RMSE and r["valid_rate_heldout"] == 1.0]
    assert rec["tokenizer"] == min(within, key=lambda k: rows[k]["tokens_per_chunk_mean"])
    assert saved["time_horizon"] == 40 and saved["time_horizon_why"] == "the chunk vla train chooses"  # 0.5 s at 80 fps
    fast_vocab = next(c for c in rows["fast"]["chosen"] if c.startswith("vocab_size = "))  # FAST's "auto", recorded
    assert f"fast: chose {fast_vocab}" in lines and "chosen" not in rows["bin"]  # ... and said
    # the answer is last: which tokenizer at which rate and chunk, why, and the command to train with it
    answer = lines[[i for i, line in enumerate(lines) if line.startswith("recommendation: ")][-1] :]
    assert answer[0].startswith(f"recommendation: {rec['tokenizer']}, ") and "ids per chunk" in answer[0]
    assert "T=40 (0.5 s at 80 fps, the chunk vla train chooses)" in answer[0]
    assert answer[1].startswith("  why: the fewest ids among the") and answer[-1].startswith(
        f"  next: vla train --dataset_root={tiny_dataset_root} --tokenizer.type="
    )
    assert (out / "compare.md").read_text().startswith("recommendation: ")
    # the same --out again is refused before any fitting, and nothing in it changes; --overwrite replaces it
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--out {out} already holds files; choose a new folder, or pass --overwrite to replace it" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--tokenizers", "bin", "--overwrite"]) == 0
    assert list(json.loads((out / "compare.json").read_text())["tokenizers"]) == ["bin"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left beside it


def test_no_tokenizer_within_the_bound_is_said(tiny_dataset_root, tmp_path):
    lines = []
    res = compare.compare(
        tiny_dataset_root,
        tmp_path / "c",
        tokenizers="bin:n_bins=8 bin:n_bins=16",
        time_horizon=4,
        heldout=0.25,
        n_random=10,
        max_rmse=1e-6,
        log=lines.append,
    )
    assert res["recommendation"]["tokenizer"] == "bin:n_bins=16" and not res["recommendation"]["within_bound"]
    assert "none decodes every held-out chunk within RMSE 1e-06, so the lowest error" in lines[-1]
    assert "--tokenizer.type=bin --tokenizer.n_bins=16 --policy.time_horizon=4" in lines[-1]
    with pytest.raises(ValueError, match="--max-rmse must be > 0"):
        compare.compare(tiny_dataset_root, tmp_path / "d", tokenizers="bin", max_rmse=0)
    assert not (tmp_path / "d").exists()


def test_fsq_fits_shorter_in_compare_unless_its_steps_are_named():
    fsq, short = compare.parse_entry("fsq"), {"steps": compare.FSQ_STEPS, "max_seconds": compare.FSQ_SECONDS}
    assert compare.entry_fit_options(fsq, {}) == short and compare.FSQ_STEPS < 3000
    assert compare.entry_fit_options(fsq, {"fsq": {"steps": None, "max_seconds": None}}) == short
    assert compare.entry_fit_options(fsq, {"fsq": {"steps": 900}}) == {"steps": 900, "max_seconds": compare.FSQ_SECONDS}
    assert compare.entry_fit_options(
        compare.parse_entry("fsq:steps=900,levels=[8,5,5]"), {"fsq": {"max_seconds": 9}}
    ) == {"max_seconds": 9}
    assert compare.entry_fit_options(compare.parse_entry("bin"), {"fsq": {"steps": 9}}) == {}


def test_a_misspelled_compare_option_is_one_line_with_the_closest(tmp_path, capsys):
    from vla.cli import main

    assert main(["compare", "--root", str(tmp_path), "--out", str(tmp_path / "o"), "--tim-horizon", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "vla compare: error: unknown option --tim-horizon; did you mean '--time-horizon'? (vla compare "
        "--help lists every option)"
    )
    assert not (tmp_path / "o").exists()


def test_tokenizer_fit_saves_tokenizer_normaliser_and_report_and_train_uses_them(tiny_dataset_root, tmp_path, capsys):
    import action_tokenizers as at

    from vla.cli import main
    from vla.config import TrainConfig
    from vla.data.reader import dataset_info
    from vla.policy import VLAConfig
    from vla.policy.factory import build_policy
    from vla.tokenizer_choice import tokenizer_config

    out = tmp_path / "tok"
    assert (
        main(
            [
                "tokenizer",
                "fit",
                "--root",
                str(tiny_dataset_root),
                "--type",
                "bin",
                "--option",
                "n_bins=64",
                "--time-horizon",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    tok = at.load_tokenizer(out)
    assert tok.name == "bin" and tok.vocab_size == 64
    report = json.loads((out / "report.json").read_text())
    row = report["tokenizers"]["bin:n_bins=64"]
    assert row["tokens_per_chunk_mean"] == 4 * 4 and row["valid_rate_heldout"] == 1.0 and row["rmse"] < 0.05
    assert (out / "rate_distortion.png").is_file() and (out / "action_normalizer.json").is_file()
    assert main(["tokenizer", "fit", "--root", str(tiny_dataset_root), "--type", "bin", "--out", str(out)]) == 1
    assert "not an empty folder" in capsys.readouterr().err
    cfg = TrainConfig(
        dataset_root=str(tiny_dataset_root),
        output_dir=str(tmp_path / "run"),
        steps=1,
        batch_size=4,
        tokenizer=tokenizer_config("bin", pretrained_path=str(out)),
        progress=False,
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, device="cpu"),
    )
    info = dataset_info(tiny_dataset_root)
    policy = build_policy(cfg, info, info.episode_index.tolist())
    assert policy.action_tokenizer.vocab_size == 64
    np.testing.assert_allclose(
        policy.action_normalizer.offset, at.Normalizer.load(out / "action_normalizer.json").offset
    )


def test_fsq_fit_time_and_steps_beside_its_error(result):
    res, out = result
    report = res["tokenizers"]["fsq"]["fit_report"]
    assert report["steps"] == 30 and report["stopped"] == "steps"  # 30 steps: no held-out check ran out of patience
    row = next(line for line in (out / "compare.md").read_text().splitlines() if line.startswith("| fsq |"))
    assert f"{res['tokenizers']['fsq']['fit_seconds']:.1f} (30 steps, steps)" in row
    assert "note: fsq fitted 30 steps only (--fsq-steps; vla train fits up to 3000)" in (out / "compare.md").read_text()
