"""The ``vla`` command itself: one spelling of a flag for every command, one line for an unknown flag, and LeRobot's
CPU warnings kept to the commands that train."""

import logging

import pytest
import torch

from vla import cli


def test_either_spelling_of_a_flag_reaches_the_command():
    options = ["--time-horizon", "--dataset_root", "--out"]
    argv = ["compare", "--time_horizon=3", "--dataset-root", "d", "--out", "o", "--tokenizers", "--x_y"]
    assert cli.one_spelling(argv, options) == [
        "compare",
        "--time-horizon=3",
        "--dataset_root",
        "d",
        "--out",
        "o",
        "--tokenizers",
        "--x_y",
    ]
    parser = cli.build_parser(["compare"])
    assert "--time-horizon" in cli.command_options(parser, ["compare", "--root", "x"])
    assert "--json" in cli.command_options(cli.build_parser(["data"]), ["data", "info", "x"])


def test_an_unknown_flag_names_the_closest(capsys, tmp_path):
    assert cli.main(["data", "info", str(tmp_path), "--jsn"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vla data: error: unknown option --jsn; did you mean '--json'? (vla data --help lists every option)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="LeRobot warns only on a machine without a GPU")
def test_lerobot_cpu_warnings_only_for_commands_that_train(tiny_dataset_root, caplog, capsys):
    from vla.policy import VLAConfig

    caplog.set_level(logging.WARNING)
    assert cli.main(["data", "info", str(tiny_dataset_root)]) == 0
    assert "what `vla train --dataset_root DIR` would choose" in capsys.readouterr().out
    quiet = [r.getMessage() for r in caplog.records]
    assert not [m for m in quiet if "No accelerated backend" in m or "Switching to 'cpu'" in m], quiet
    assert not logging.getLogger().filters  # the filter is gone once the command returns
    VLAConfig()  # outside a command, as in training, LeRobot still says it
    assert any("No accelerated backend detected" in r.getMessage() for r in caplog.records)
