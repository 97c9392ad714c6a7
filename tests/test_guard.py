"""The repository's folder ``tokenizers/`` must never shadow Hugging Face's ``tokenizers`` package."""

import ast
import sys
from pathlib import Path

import tokenizers

ROOT = Path(__file__).resolve().parents[1]


def test_tokenizers_is_hugging_face():
    assert hasattr(tokenizers, "Tokenizer") and hasattr(tokenizers, "models")
    assert "site-packages" in str(Path(tokenizers.__file__)), tokenizers.__file__


def test_no_init_in_tokenizers_folder():
    assert not (ROOT / "tokenizers" / "__init__.py").exists()


def test_library_imports_only_its_allowed_dependencies():
    allowed = {"numpy", "scipy", "torch", "tokenizers", "safetensors", "tqdm", "vector_quantize_pytorch"}
    stdlib = set(sys.stdlib_module_names)  # the standard library is always allowed; third-party packages are not
    for path in (ROOT / "tokenizers" / "action_tokenizers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed | stdlib, f"{path.name} imports {name}"
