"""Dataset faults users met, reproduced through the CLI: each is one line that names the file, the field and the fix,
and nothing is written (no run folder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vla.cli import main


def copy_with_info(src: Path, dst: Path, **fields) -> Path:
    """A copy of the dataset at ``src`` with ``fields`` set in meta/info.json."""
    shutil.copytree(src, dst)
    path = dst / "meta" / "info.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields, indent=2))
    return dst


def train_args(root: Path, out: Path) -> list[str]:
    return [
        "train",
        f"--dataset_root={root}",
        f"--output_dir={out}",
        "--steps=1",
        "--policy.preset=micro",
        "--policy.device=cpu",
        "--progress=false",
    ]


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vla {command}: error: "), err
    return err[0]


@pytest.mark.parametrize("fps, shown", [("abc", "'abc'"), (-5, "-5"), (0, "0"), (12.5, "12.5"), (None, "None")])
def test_a_bad_fps_is_named_with_its_file_and_the_fix(tiny_dataset_root, tmp_path, capsys, fps, shown):
    """`"fps": "abc"` gave "invalid literal for int() with base 10: 'abc'"; `"fps": -5` trained at -5 fps."""
    root = copy_with_info(tiny_dataset_root, tmp_path / "ds", fps=fps)
    for command, args in (("train", train_args(root, tmp_path / "run")), ("data", ["data", "info", str(root)])):
        assert main(args) == 1
        line = one_line_error(capsys, command)
        assert (
            f'{root / "meta" / "info.json"}: "fps" is {shown}; it must be the recording rate, a positive whole '
            "number of frames per second (e.g. 30). Fix the file or download or record the dataset again" in line
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("features", [], '"features" is []; it must be an object naming each feature'),
        ("robot_type", 7, '"robot_type" is 7; it must be a string or absent'),
    ],
)
def test_other_bad_fields_name_the_field(tiny_dataset_root, tmp_path, capsys, field, value, message):
    root = copy_with_info(tiny_dataset_root, tmp_path / "ds", **{field: value})
    assert main(train_args(root, tmp_path / "run")) == 1
    assert message in one_line_error(capsys, "train") and not (tmp_path / "run").exists()


def test_a_bad_shape_is_named(tiny_dataset_root, tmp_path, capsys):
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info["features"]["action"]["shape"] = [0]
    path.write_text(json.dumps(info))
    assert main(["data", "info", str(root)]) == 1
    assert '"features.action.shape" is [0]; it must be a list of positive whole numbers' in one_line_error(
        capsys, "data"
    )


def test_a_truncated_data_file_says_to_download_again_and_info_names_its_episodes(tiny_dataset_root, tmp_path, capsys):
    """pyarrow said "Parquet magic bytes not found in footer..." with the path and no next step."""
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    path = sorted((root / "data").glob("*/*.parquet"))[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(train_args(root, tmp_path / "run")) == 1
    line = one_line_error(capsys, "train")
    assert f"{path} is not a readable parquet file (" in line
    assert "the data file is truncated or damaged; download or record the dataset again" in line
    assert not (tmp_path / "run").exists()
    assert main(["data", "info", str(root)]) == 1
    line = one_line_error(capsys, "data")
    assert f"1 data file(s) cannot be read ({path.relative_to(root)}: episodes 0-3 (" in line
    assert "download or record the dataset again" in line


def test_a_data_file_the_episode_table_names_but_the_folder_lacks(tiny_dataset_root, tmp_path, capsys):
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    path = sorted((root / "data").glob("*/*.parquet"))[0]
    path.rename(path.with_name("file-009.parquet"))  # the data is there, under a name the episode table does not use
    assert main(["data", "info", str(root)]) == 1
    line = one_line_error(capsys, "data")
    assert f"1 data file(s) cannot be read ({path.relative_to(root)}: episodes 0-3 (missing))" in line


def rewrite_parquet(path: Path, **columns) -> None:
    """``path`` with ``columns`` replaced (name -> function of the old numpy column), written under a temporary name
    then renamed, keeping the file's schema (LeRobot's feature metadata included)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for name, change in columns.items():
        column = table.column(name)
        i = table.column_names.index(name)
        table = table.set_column(i, table.field(name), pa.array(change(column.to_numpy()), column.type))
    pq.write_table(table, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def refused_everywhere(root: Path, tmp_path: Path, capsys, message: str) -> None:
    """`vla data info` and `vla train` both end in one line holding ``message``; training writes nothing."""
    assert main(["data", "info", str(root)]) == 1
    assert message in one_line_error(capsys, "data")
    assert main(train_args(root, tmp_path / "run")) == 1
    assert message in one_line_error(capsys, "train")
    assert not (tmp_path / "run").exists()


def test_a_task_index_missing_from_the_task_table_is_refused_before_training(tiny_dataset_root, tmp_path, capsys):
    """`vla data info` said nothing and `vla train` died with IndexError at its first batch, leaving
    train_config.json behind."""
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    data = sorted((root / "data").glob("*/*.parquet"))[0]
    rewrite_parquet(data, task_index=lambda t: t + 3 * (np.arange(len(t)) >= 198))  # episode 3: task_index 3
    refused_everywhere(
        root,
        tmp_path,
        capsys,
        f"{root}: the data's task_index 3 (episodes 3) names no task: "
        "meta/tasks.parquet lists task_index 0..0; restore meta/tasks.parquet or download or record",
    )
    (root / "meta" / "tasks.parquet").unlink()
    refused_everywhere(
        root,
        tmp_path,
        capsys,
        f"{root}: the data's task_index 0, 3 (episodes 0-3) names no task: "
        "meta/tasks.parquet is missing; restore meta/tasks.parquet",
    )


def test_an_episode_table_length_that_disagrees_with_the_data_is_refused(tiny_dataset_root, tmp_path, capsys):
    """Episode metadata saying 20 frames where the data held 64: info and training counted different frames."""
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    table = sorted((root / "meta" / "episodes").glob("*/*.parquet"))[0]
    rewrite_parquet(table, length=lambda n: np.where(np.arange(len(n)) == 0, 20, n))
    refused_everywhere(
        root,
        tmp_path,
        capsys,
        f"{root}: meta/episodes says episode 0 has 20 frames but the data "
        "holds 64; the episode table does not match the data: download or record the dataset again",
    )


def test_an_episode_whose_timestamps_are_all_equal_is_flagged(tiny_dataset_root, tmp_path, capsys):
    root = shutil.copytree(tiny_dataset_root, tmp_path / "ds")
    data = sorted((root / "data").glob("*/*.parquet"))[0]
    rewrite_parquet(data, timestamp=lambda t: np.where((np.arange(len(t)) >= 64) & (np.arange(len(t)) < 132), 0, t))
    assert main(["data", "info", str(root)]) == 0
    out = capsys.readouterr().out
    assert (
        "WARNING: episodes 1: every frame has the same timestamp (0 s) instead of frame_index / fps (0.0125 s "
        "apart), so frames found by time (LeRobot's reader, videos) would all be the first" in out
    )
    from vla.data.torch_dataset import ActionChunkDataset

    with pytest.raises(ValueError, match=r"episodes 1: every frame has the same timestamp \(0 s\)"):
        ActionChunkDataset(root, 5, backend="lerobot")  # LeRobot reads chunks by time: refused
    assert len(ActionChunkDataset(root, 5, backend="memory")) == 248  # by row: the timestamps are not read
