"""Files: atomic writes and versioned JSON reads, used by every save and load in the library.

    with atomic_directory("tok/") as tmp:      # write into tmp; on success it replaces tok/ in one rename
        write_json(tmp / "config.json", {"format_version": 1, ...})
    config = read_json(Path("tok/config.json"), "action tokenizer", format_version=1)
    tensors = read_tensors(Path("tok/model.safetensors"), like=model.state_dict(), fix="save the tokenizer again")

Every error names the file and what to do about it, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# safetensors' names of the floating dtypes: any other (I8, I64, BOOL, ...) where a model holds floats is refused
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (a reader never sees half a file)."""
    atomic_write_text(Path(path), json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(
    path: Path, what: str, format_version: int | None = None, *, assume_version: int | None = None
) -> dict[str, Any]:
    """Read a JSON object, raising a one-line ``ValueError`` naming ``path`` when it is missing or corrupt.

    With ``format_version``, the file's ``format_version`` must equal it; a file without one is taken to be
    ``assume_version`` (for files written before versions were recorded), or refused when that is None.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what}: {path} is missing; is this a directory written by save_pretrained?")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        reason = str(err).splitlines()[0]
        raise ValueError(f"{what}: {path} is not valid JSON ({reason}); save it again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: {path} must hold a JSON object, not {type(data).__name__}; save it again")
    if format_version is not None:
        found = data.get("format_version", assume_version)
        if found != format_version:
            raise ValueError(
                f"{what}: {path} has format_version {found!r} but this library reads {format_version}; "
                "save it again with this version of action_tokenizers, or load it with the version that wrote it"
            )
    return data


def check_tensor_kinds(path: Path, like: dict[str, torch.Tensor], fix: str) -> None:
    """Refuse a safetensors file (reading its header only) holding integers where ``like`` (the model's state) holds
    floats, or floats where it holds integers: ``load_state_dict`` would cast them silently (weights saved as int8
    load and act with errors of 1e9). One-line ``ValueError`` naming the file, the key, both dtypes and ``fix``;
    safetensors' own error for a file it cannot read is left to the caller."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            if key not in like:
                continue
            dtype = f.get_slice(key).get_dtype()
            if (dtype in FLOAT_DTYPES) != like[key].is_floating_point():
                held = str(like[key].dtype).removeprefix("torch.")
                raise ValueError(
                    f"{path}: tensor {key!r} is {dtype} but the model holds {held} there (loading would cast it "
                    f"silently); {fix}"
                )


def read_tensors(path: Path, like: dict[str, torch.Tensor], fix: str) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, checked: the kinds of ``like`` (``check_tensor_kinds``) and finite values.
    One-line ``ValueError`` naming the file, the key and ``fix``, also for a file safetensors cannot read."""
    import torch
    from safetensors.torch import load_file

    try:
        check_tensor_kinds(path, like, fix)
        tensors = load_file(str(path))
    except Exception as err:
        if isinstance(err, ValueError) and str(path) in str(err):  # check_tensor_kinds' own line
            raise  # safetensors raises its own error types for truncated files
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{path} cannot be read ({reason}); {fix}") from None
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(f"{path}: tensor {key!r} holds NaN or inf; {fix}")
    return tensors


@contextmanager
def atomic_directory(directory: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``directory``; on success it replaces ``directory`` in one rename.

    On an exception nothing is left behind and an existing ``directory`` is untouched.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a saved model should not be
        yield tmp
        for path in tmp.rglob("*"):
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.rename(final, old / "x")
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Yield a file open at a temporary name in ``path``'s directory; on success it is renamed to ``path``, on an
    exception removed (an existing ``path`` untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file through a temporary name in the same directory, then rename it into place."""
    with atomic_file(path) as f:
        f.write(text)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
