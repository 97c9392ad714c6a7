"""Saved files: atomic, versioned, and validated on load with the file named."""

import json

import action_tokenizers as at
import numpy as np
import pytest
from action_tokenizers.io import read_json, write_json


def _edit(path, **changes):
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("fast", {"scale": 0}, "'scale' is 0 but must be a positive number"),
        ("fast", {"scale": -10}, "'scale' is -10 but must be a positive number"),
        ("fast", {"order": "time"}, "'order' is 'time'"),
        ("fast", {"n_symbols": "many"}, "'n_symbols'"),
        ("bin", {"n_bins": 1}, "'n_bins' is 1"),
        ("fsq", {"hidden": "x"}, "'hidden' is 'x' but must be a positive integer"),
        ("fsq", {"levels": [8, 1]}, "'levels'"),
        ("beast", {"degree": 12}, "degree 12 needs more than 12 control points"),
        ("beast", {"ridge": -1}, "'ridge' is -1"),
        ("fast", {"type": "fats"}, "did you mean 'fast'"),
    ],
)
def test_bad_saved_config_is_one_line_naming_the_file(all_toks, tmp_path, name, changes, message):
    path = all_toks[name].save_pretrained(tmp_path / "tok") / "action_tokenizer.json"
    _edit(path, **changes)
    with pytest.raises(ValueError, match=message) as err:
        at.load_tokenizer(tmp_path / "tok")
    assert str(path.parent) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["fast", "fast_byte_level"])
def test_a_fast_config_that_does_not_fit_its_bpe_is_refused_on_load(all_toks, tmp_path, name):
    """A smaller alphabet than the vocabulary spells, or a byte-level vocabulary read as character-level, would load
    and then fail (or cut rows wrongly) at the first encode: refused on load, naming the file."""
    tok = all_toks[name]
    path = tok.save_pretrained(tmp_path / "tok") / "action_tokenizer.json"
    _edit(path, **({"n_symbols": tok.n_symbols - 1} if name == "fast" else {"byte_level": False}))
    with pytest.raises(ValueError, match="beyond the .*-symbol alphabet .*save or refit") as err:
        at.load_tokenizer(tmp_path / "tok")
    assert str(path.parent) in str(err.value)


def test_truncated_weights_are_one_line_naming_the_file(fsq_tok, tmp_path):
    weights = fsq_tok.save_pretrained(tmp_path / "tok") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors cannot be read") as err:
        at.load_tokenizer(tmp_path / "tok")
    assert str(weights) in str(err.value) and "save the tokenizer again" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2]", "", "\x00\xff"])
def test_garbage_config_is_one_line_naming_the_file(fast_tok, tmp_path, garbage):
    path = fast_tok.save_pretrained(tmp_path / "tok") / "action_tokenizer.json"
    path.write_text(garbage)
    with pytest.raises(ValueError) as err:
        at.load_tokenizer(tmp_path / "tok")
    assert str(path) in str(err.value) and "\n" not in str(err.value) and "again" in str(err.value)


def test_read_json_checks_the_format_version(tmp_path):
    write_json(tmp_path / "a.json", {"format_version": 2, "x": 1})
    assert read_json(tmp_path / "a.json", "thing")["x"] == 1
    assert read_json(tmp_path / "a.json", "thing", format_version=2)["x"] == 1
    with pytest.raises(ValueError, match=r"a.json has format_version 2 but this library reads 1"):
        read_json(tmp_path / "a.json", "thing", format_version=1)
    write_json(tmp_path / "b.json", {"x": 1})
    with pytest.raises(ValueError, match="format_version None"):
        read_json(tmp_path / "b.json", "thing", format_version=1)
    assert read_json(tmp_path / "b.json", "thing", format_version=1, assume_version=1)["x"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic: no temporaries left


def test_normaliser_file_is_versioned_and_validated(tmp_path):
    norm = at.Normalizer.fit(np.random.default_rng(0).normal(size=(100, 3)))
    path = norm.save(tmp_path / "norm.json")
    assert json.loads(path.read_text())["format_version"] == 1
    data = json.loads(path.read_text())
    del data["format_version"]  # files written before versions were recorded still load
    path.write_text(json.dumps(data))
    np.testing.assert_array_equal(at.Normalizer.load(path).scale, norm.scale)
    for changes, message in [
        ({"format_version": 7}, "format_version 7"),
        ({"scale": [1.0, -10.0, 1.0]}, "flip"),
        ({"scale": [1.0, 2.0]}, "same length"),
        ({"offset": "x"}, "malformed"),
        ({"mode": "quantil"}, "did you mean 'quantile'"),
    ]:
        path.write_text(json.dumps({**data, **changes}))
        with pytest.raises(ValueError, match=message) as err:
            at.Normalizer.load(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value)
