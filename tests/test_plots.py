"""The suite's plot check (``tests.conftest.assert_plot``) tells a drawn plot from a blank figure or empty axes."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.conftest import assert_plot  # noqa: E402


def _save(path, draw):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    draw(fig, ax)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def test_a_drawn_plot_passes_and_blank_or_empty_figures_fail(tmp_path):
    assert_plot(_save(tmp_path / "line.png", lambda fig, ax: ax.plot(np.sin(np.linspace(0, 6, 50)))))
    blank = _save(tmp_path / "blank.png", lambda fig, ax: ax.axis("off"))
    with pytest.raises(AssertionError, match="pixels are marked"):
        assert_plot(blank)
    empty = _save(tmp_path / "empty.png", lambda fig, ax: ax.set(xlabel="step", ylabel="loss"))
    with pytest.raises(AssertionError, match="no coloured marks"):
        assert_plot(empty)
    with pytest.raises(AssertionError, match="pixels"):
        assert_plot(tmp_path / "line.png", min_width=2000)
