"""A dataset's ``meta/`` folder, read in one place: every field is checked where it is read, and a bad one is one
``ValueError`` that names the file, the field and the fix (``vla.data.reader`` and ``vla.data.convert`` read through here).

    info = InfoFile.read(root)           # meta/info.json
    info.fps(), info.features(), info.text("robot_type"), info.count("total_episodes")
    table = episode_table(root)          # meta/episodes/*.parquet (v3.0): episode ids, lengths, their data files
    tasks = read_tasks(root)             # meta/tasks.parquet (v3.0)
    names, problem = flat_names(feature["names"], 6, "meta/info.json: features.action.names")

Feature names are found in several layouts in the wild, all read as one flat list (``flat_names``): a flat list, a
list holding one list (v2.x datasets), a dict of lists (``{"motors": [...]}``, several keys joined in order), or none.
Names whose count differs from the feature's size are dropped (None) with a note: names are labels, and a dataset
whose labels are wrong still trains (the note says what was ignored).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

REDOWNLOAD = "download or record the dataset again"


class InfoFile:
    """``meta/info.json``: its fields, each validated when read."""

    def __init__(self, path: Path, raw: dict[str, Any]):
        self.path, self.raw = path, raw

    @classmethod
    def read(cls, root: str | Path) -> InfoFile:
        path = Path(root) / "meta" / "info.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path} is missing; pass the dataset folder that holds meta/info.json") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(
                f"{path} is not valid JSON ({str(err).splitlines()[0]}); fix the file or {REDOWNLOAD}"
            ) from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path} holds a JSON {type(raw).__name__}, not an object; {REDOWNLOAD}")
        return cls(path, raw)

    def bad(self, field: str, value: Any, want: str) -> ValueError:
        """The one-line error for a bad field: the file, the field, its value and what it must be."""
        return ValueError(f'{self.path}: "{field}" is {value!r}; it must be {want}. Fix the file or {REDOWNLOAD}')

    @property
    def version(self) -> str | None:
        return self.text("codebase_version")

    def fps(self) -> int:
        """The recording rate: a positive whole number of frames per second (LeRobot stores an integer)."""
        value = self.raw.get("fps")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
            or value != int(value)
        ):
            raise self.bad("fps", value, "the recording rate, a positive whole number of frames per second (e.g. 30)")
        return int(value)

    def text(self, field: str) -> str | None:
        value = self.raw.get(field)
        if value is not None and not isinstance(value, str):
            raise self.bad(field, value, "a string or absent")
        return value

    def count(self, field: str, default: int | None = None) -> int:
        value = self.raw.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.bad(field, value, "a whole number >= 0")
        return value

    def features(self) -> dict[str, dict[str, Any]]:
        """``{name: {"dtype", "shape", "names", ...}}`` with each shape a list of positive ints and, for a vector
        feature (not a camera), ``names`` one flat list of ``prod(shape)`` strings or None. Notes on names that were
        dropped are in ``self.notes`` after the call."""
        features = self.raw.get("features")
        if not isinstance(features, dict) or not features:
            raise self.bad("features", features, "an object naming each feature (action, observation.state, ...)")
        out, self.notes = {}, []
        for key, feature in features.items():
            where = f"features.{key}"
            if not isinstance(feature, dict):
                raise self.bad(where, feature, "an object with dtype and shape")
            dtype, shape = feature.get("dtype"), feature.get("shape")
            if not isinstance(dtype, str):
                raise self.bad(f"{where}.dtype", dtype, "a string such as float32, image or video")
            if isinstance(shape, int) and not isinstance(shape, bool):
                shape = [shape]
            if (
                not isinstance(shape, (list, tuple))
                or not shape
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
            ):
                raise self.bad(f"{where}.shape", shape, "a list of positive whole numbers, e.g. [6]")
            feature = dict(feature, shape=list(shape))
            if dtype not in ("image", "video"):  # a camera's names label its axes (height, width, channels)
                names, note = flat_names(feature.get("names"), int(np.prod(shape)), f"{self.path}: {where}.names")
                feature["names"] = names
                if note:
                    self.notes.append(note)
            out[key] = feature
        return out


def flat_names(names: Any, size: int, where: str = "names") -> tuple[list[str] | None, str | None]:
    """Feature names in any layout found in the wild -> (one flat list of ``size`` strings, or None; a note saying
    why names were dropped, or None). Layouts: a flat list, nested lists (``[[...]]``), a dict of lists (joined in
    key order), a string (one name), or None."""
    flat = _flatten(names)
    if flat is None:
        return None, None
    if len(flat) != size:
        return None, (
            f"{where} lists {len(flat)} names for {size} values; they are ignored (the dims are numbered "
            "instead). Give one name per value to have grippers and state dims found by name"
        )
    return flat, None


def _flatten(names: Any) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    if isinstance(names, dict):
        parts = [_flatten(v) for v in names.values()]
        return None if any(p is None for p in parts) or not parts else [n for p in parts for n in p]
    if isinstance(names, (list, tuple)):
        parts = [_flatten(v) if isinstance(v, (list, tuple, dict)) else [str(v)] for v in names]
        return None if any(p is None for p in parts) else [n for p in parts for n in p]
    return None


def read_parquet(path: Path, columns: list[str] | None = None, *, what: str = "data file"):
    """A parquet table, or a ``ValueError`` naming the damaged file and the fix (pyarrow's message says neither)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(
            f"{path} is not a readable parquet file ({str(err).splitlines()[0]}): the {what} is truncated "
            f"or damaged; {REDOWNLOAD} (`vla data info` names the episodes it holds)"
        ) from None
    except KeyError as err:  # a column meta/info.json promises is not in the file
        raise ValueError(
            f"{path} lacks the column {err}; the {what} does not match meta/info.json: {REDOWNLOAD}"
        ) from None


def damaged_parquet(path: Path) -> str | None:
    """Why ``path`` is not a readable parquet file (its footer is read, nothing else), or None when it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except (pa.ArrowInvalid, OSError) as err:
        return str(err).splitlines()[0]
    return None


DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"  # LeRobot v3.0's default data_path


def episode_table(root: Path, data_path: str | None = None) -> dict[str, np.ndarray]:
    """meta/episodes/*.parquet (v3.0), sorted by episode: ``episode_index`` and ``length`` int64 [E], and, when the
    table says where each episode's frames are, ``data_file`` [E]: paths relative to ``root`` (meta/info.json's
    ``data_path`` template)."""
    import pyarrow as pa

    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    if not files:
        raise ValueError(f"{root} has no episode table (meta/episodes/chunk-*/file-*.parquet); {REDOWNLOAD}")
    tables = []
    for f in files:
        table = read_parquet(f, what="episode table")
        for column in ("episode_index", "length"):
            if column not in table.column_names:
                raise ValueError(f"{f} has no {column!r} column; the episode table is not LeRobot v3.0's: {REDOWNLOAD}")
        keep = [
            c for c in ("episode_index", "length", "data/chunk_index", "data/file_index") if c in table.column_names
        ]
        tables.append(table.select(keep))
    table = pa.concat_tables(tables, promote_options="default")
    episodes, lengths = table.column("episode_index").to_numpy(), table.column("length").to_numpy()
    order = np.argsort(episodes, kind="stable")
    episodes, lengths = episodes[order].astype(np.int64), lengths[order].astype(np.int64)
    where = files[0].parent.parent
    repeated = episodes[1:][np.diff(episodes) == 0]
    if len(repeated):
        raise ValueError(f"{where}: episode {int(repeated[0])} is listed more than once; {REDOWNLOAD}")
    if (lengths < 1).any():
        bad = int(episodes[np.argmax(lengths < 1)])
        raise ValueError(
            f"{where}: episode {bad} has length {int(lengths[episodes == bad][0])}; every episode needs "
            f"at least one frame: {REDOWNLOAD}"
        )
    out = {"episode_index": episodes, "length": lengths}
    if {"data/chunk_index", "data/file_index"} <= set(table.column_names):
        chunk = table.column("data/chunk_index").to_numpy()[order]
        file = table.column("data/file_index").to_numpy()[order]
        template = data_path or DATA_PATH
        try:
            paths = [template.format(chunk_index=int(c), file_index=int(i)) for c, i in zip(chunk, file)]
        except (KeyError, IndexError, ValueError):
            raise ValueError(
                f'{root / "meta" / "info.json"}: "data_path" is {template!r}; it must be LeRobot '
                f"v3.0's template, e.g. {DATA_PATH!r}. Fix the file or {REDOWNLOAD}"
            ) from None
        out["data_file"] = np.array(paths, dtype=object)
    return out


def read_tasks(root: Path) -> list[str]:
    """meta/tasks.parquet's task strings by ``task_index`` (empty when the file is absent)."""
    path = root / "meta" / "tasks.parquet"
    if not path.is_file():
        return []
    frame = read_parquet(path, what="task table").to_pandas()  # the task string is the index, task_index a column
    if "task_index" not in frame.columns:
        raise ValueError(f"{path} has no 'task_index' column; the task table is not LeRobot v3.0's: {REDOWNLOAD}")
    frame = frame.sort_values("task_index")
    listed = frame["task_index"].tolist()
    if listed != list(range(len(listed))):  # the list is read by position: a gap would give rows the wrong task
        must = f"they must be 0..{len(listed) - 1}, one row each"
        raise ValueError(f"{path} lists task_index {listed[:10]}; {must}: {REDOWNLOAD}")
    return [str(task) for task in frame.index]
