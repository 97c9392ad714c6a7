"""The code's shape: no function over ``MAX_FUNCTION_LINES`` lines in ``vla/`` or ``action_tokenizers/`` (its
docstring and signature included), so that each reads on one screen and a long one is split by what it does."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_a_screen():
    long = []
    for folder in (ROOT / "vla", ROOT / "tokenizers" / "action_tokenizers"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: split them by what they do: {long}"
