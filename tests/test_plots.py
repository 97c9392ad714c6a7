"""The suite's plot check (``tests.conftest.assert_plot``) tells a drawn plot from a blank figure or empty axes; plots
are saved whole or not at all (``vla.io.save_figure``)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.conftest import assert_plot  # noqa: E402
from vla.io import save_figure  # noqa: E402


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


def test_a_plot_is_saved_whole_or_the_old_one_stays(tmp_path, monkeypatch):
    """``save_figure`` writes through a temporary name and closes the figure; a save that fails midway leaves the
    previous plot as it was and no temporary file."""
    path = tmp_path / "plot.png"
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(np.arange(10))
    save_figure(fig, path)
    assert_plot(path)
    assert not plt.fignum_exists(fig.number) and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    before = path.read_bytes()
    fig, ax = plt.subplots()
    ax.plot(np.arange(5))

    def broken(file, **kwargs):
        file.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        save_figure(fig, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
