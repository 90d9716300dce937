"""Anytime curves: the grid evaluation behind --plot, and the CLI writing the figure."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.analysis.plots import anytime_on_grid
from gfsim.cli.main import app

runner = CliRunner()


def run(*curves):
    """A stand-in ReplayResult: searches with anytime rows (seconds, usd, joules, evals, best)."""
    return SimpleNamespace(searches=[SimpleNamespace(anytime=np.array(c, dtype=float))
                                     for c in curves])


def test_best_at_each_spend_is_a_step_function_held_after_the_search_ends():
    a = [[0, 0, 0, 0, 1.0], [10, 2, 0, 1, 2.0], [20, 5, 0, 2, 4.0]]
    b = [[0, 0, 0, 0, 1.0], [5, 1, 0, 1, 1.0], [30, 3, 0, 2, 8.0]]
    grid = [0, 1.5, 2, 4, 100]
    y = anytime_on_grid([run(a, b)], "usd", grid)[0]
    # geometric mean over the two searches at each USD per search
    assert y == pytest.approx([1.0, 1.0, np.sqrt(2 * 1), np.sqrt(2 * 8), np.sqrt(4 * 8)])
    y = anytime_on_grid([run(a, b)], "wall_s", [0, 10, 25, 30])[0]
    assert y == pytest.approx([1.0, np.sqrt(2 * 1), np.sqrt(4 * 1), np.sqrt(4 * 8)])
    two = anytime_on_grid([run(a), run(b)], "usd", grid)
    assert two.shape == (2, 5) and two[1] == pytest.approx([1.0, 1.0, 1.0, 8.0, 8.0])


def test_cli_plot_writes_a_png_and_rejects_other_paths(tmp_path):
    png = tmp_path / "curves.png"
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--seeds", "2",
                              "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--plot",
                              str(tmp_path / "x.jpg")])
    assert res.exit_code == 2 and "--plot writes a .png" in res.output
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--plot",
                              str(tmp_path / "no" / "x.png")])
    assert res.exit_code == 2 and "does not exist" in res.output
