import json

import action_tokenizers as at
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

finite = st.floats(-1e3, 1e3, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(data=arrays(np.float64, (20, 3), elements=finite), mode=st.sampled_from(["quantile", "mean_std", "identity"]))
def test_round_trip(data, mode):
    norm = at.Normalizer.fit(data, mode)
    np.testing.assert_allclose(norm.unnormalize(norm.normalize(data)), data, rtol=1e-9, atol=1e-6)


def test_quantile_maps_q01_q99_to_minus_one_one():
    stats = {"q01": [0.0, -2.0], "q99": [10.0, 2.0], "mean": [5, 0], "std": [1, 1]}
    norm = at.Normalizer.from_stats(stats, "quantile")
    np.testing.assert_allclose(norm.normalize(np.array([[0.0, -2.0], [10.0, 2.0]])), [[-1, -1], [1, 1]])


def test_constant_dimension_maps_to_zero_and_back():
    data = np.stack([np.linspace(0, 1, 50), np.full(50, 3.0)], axis=1)
    norm = at.Normalizer.fit(data)
    assert np.all(norm.normalize(data)[:, 1] == 0)
    np.testing.assert_allclose(norm.unnormalize(norm.normalize(data)), data)


def test_save_load(tmp_path):
    norm = at.Normalizer.fit(np.random.default_rng(0).normal(size=(100, 4)), "mean_std")
    path = norm.save(tmp_path / "norm.json")
    loaded = at.Normalizer.load(path)
    assert loaded.mode == "mean_std"
    np.testing.assert_array_equal(loaded.offset, norm.offset)
    np.testing.assert_array_equal(loaded.scale, norm.scale)


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'quantile'"):
        at.Normalizer.fit(np.zeros((3, 2)), "quantil")
    with pytest.raises(ValueError, match="lack q01"):
        at.Normalizer.from_stats({"mean": [0.0]}, "quantile")
    with pytest.raises(ValueError, match="last dimension 2"):
        at.Normalizer.identity(2).normalize(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="NaN"):
        at.Normalizer.fit(np.array([[np.nan]]))
    (tmp_path / "bad.json").write_text(json.dumps({"mode": "quantile"}))
    with pytest.raises(ValueError, match="malformed"):
        at.Normalizer.load(tmp_path / "bad.json")
