"""Names a user types (a preset, a tokenizer, a task, a camera) checked against the known ones, in one place."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggestion(name: object, known: Iterable[str], cutoff: float = 0.5) -> str:
    """``"; did you mean 'x'?"`` for the closest known name, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_name(kind: str, name: object, known: Iterable[str]) -> str:
    """Return ``name`` if it is known; otherwise a ``ValueError`` naming the closest one and every known one."""
    known = list(known)
    if name in known:
        return str(name)
    raise ValueError(f"unknown {kind} {name!r}{suggestion(name, known)} (known: {', '.join(map(str, known))})")
