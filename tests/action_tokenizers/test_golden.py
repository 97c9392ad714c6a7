"""Golden ids on fixed chunks. Regenerate with ``python scripts/make_golden.py`` only when a change is intended."""

import importlib.util
import json
from pathlib import Path

import action_tokenizers as at
import pytest

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", Path(__file__).parents[2] / "scripts" / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)


@pytest.fixture(scope="module")
def golden():
    return json.loads((GOLDEN / "ids.json").read_text())


@pytest.fixture(scope="module")
def recipe():
    return make_golden.recipe()


@pytest.mark.parametrize("name", ["fast", "fast_byte_level", "bin", "beast"])
def test_refitted_tokenizers_give_golden_ids(golden, recipe, name):
    assert recipe["tokenizers"][name].encode(recipe["probe"]) == golden[name]


def test_stored_fsq_gives_golden_ids(golden, recipe):
    assert at.load_tokenizer(GOLDEN / "fsq").encode(recipe["probe"]) == golden["fsq"]
