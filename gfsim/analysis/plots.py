"""Figures (matplotlib, headless): reliability diagrams, risk-coverage and anytime curves."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

__all__ = ["plot_scores", "plot_anytime", "anytime_panels", "anytime_on_grid",
           "best_axis_label"]


def plot_scores(curves: list[dict], path: str | Path, title: str = "") -> Path:
    """``curves``: per forecaster {name, reliability: [...buckets], coverage, risk}. Writes a
    two-panel PNG (reliability diagram, risk-coverage curve) under ``title``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rel, ax_rc) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax_rel.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for c in curves:
        buckets = c["reliability"]
        ax_rel.plot([b["confidence"] for b in buckets], [b["accuracy"] for b in buckets],
                    marker="o", label=f"{c['name']} (ECE {c['ece']:.3f})")
        ax_rc.plot(c["coverage"], c["risk"], drawstyle="steps-post",
                   label=f"{c['name']} (AURC {c['aurc']:.3f})")
    ax_rel.set(xlabel="confidence on the declared bin (10 equal-width buckets)",
               ylabel="accuracy in the bucket", xlim=(0, 1), ylim=(0, 1),
               title="Reliability")
    ax_rc.set(xlabel="coverage (share of rows forecast, not abstained)",
              ylabel="selective risk (share of wrong bins)", xlim=(0, 1), ylim=(0, 1),
              title="Risk-coverage")
    for ax in (ax_rel, ax_rc):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# Anytime curves: columns of SearchResult.anytime.
_X_COLUMNS = {"usd": (1, 1.0, "USD spent per search"),
              "wall_s": (0, 1 / 3600, "wall-clock hours per search")}


def anytime_on_grid(results, x: str, grid) -> np.ndarray:
    """(n_results, len(grid)): for each replay (one per seed), the geometric mean over its
    searches of the best speedup found once each search had spent ``grid[j]`` (USD or
    seconds, per search). A search that finished before keeps its final best."""
    from gfsim.simulator.results import best_at

    col = _X_COLUMNS[x][0]
    grid = np.asarray(grid, dtype=float)
    out = np.empty((len(results), len(grid)))
    for i, res in enumerate(results):
        logs = []
        for s in res.searches:
            logs.append(np.log(best_at(s.anytime, col, grid)))
        out[i] = np.exp(np.mean(logs, axis=0))
    return out


def best_axis_label(series: dict) -> str:
    """The best-speedup axis, labelled by what the bests of every replay in ``series`` rest
    on (``simulator.replay.best_evidence``): measured, partly invented, or SIMULATED."""
    from gfsim.simulator.replay import best_evidence

    bases = {best_evidence(r)["basis"] for runs in series.values() for r in runs}
    word = ("SIMULATED" if "simulated" in bases else
            "partly INVENTED" if "invented" in bases else "measured")
    return f"best {word} speedup (geo-mean over tasks)"


def anytime_panels(series: dict, axes, *, band: float = 95.0, points: int = 300,
                   styles: dict | None = None) -> None:
    """Draw ``series`` (label -> list of ReplayResult, one per seed) on two axes: best against
    USD and against wall-clock. The line is the mean over seeds, the band the middle ``band``%
    of seeds; ``styles`` maps a label to extra line options (e.g. dashed). The best's axis
    says what it rests on (``best_axis_label``)."""
    ylabel = best_axis_label(series)
    for ax, x in zip(axes, ("usd", "wall_s")):
        col, scale, label = _X_COLUMNS[x]
        top = max(s.anytime[:, col].max() for runs in series.values() for r in runs
                  for s in r.searches)
        grid = np.linspace(0, top, points)
        for name, runs in series.items():
            y = anytime_on_grid(runs, x, grid)
            line, = ax.plot(grid * scale, y.mean(axis=0), label=f"{name} ({len(runs)} seeds)",
                            drawstyle="steps-post", **(styles or {}).get(name, {}))
            if len(runs) > 1:
                lo, hi = np.percentile(y, [(100 - band) / 2, (100 + band) / 2], axis=0)
                ax.fill_between(grid * scale, lo, hi, step="post", alpha=0.2,
                                color=line.get_color(), linewidth=0)
        ax.set(xlabel=label, ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def plot_anytime(series: dict, path: str | Path, title: str = "") -> Path:
    """A two-panel PNG of anytime curves with bands over seeds (see ``anytime_panels``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    anytime_panels(series, axes)
    n = max(len(v) for v in series.values())
    fig.suptitle(f"{title}\nmean over seeds; band: middle 95% of seeds" if n > 1 else title,
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- tuning ---------------------------------------------------------------------------------
# An objective's axis label, with its unit.
OBJECTIVE_LABELS = {
    # a study's bests are measured under the trace driver, simulated in a closed loop
    "best_speedup": "best speedup found (x, geo-mean over tasks)",
    "score": "standardised score (0 = random order, 1 = the log's best)",
    "usd": "USD per search ($)",
    "wall_s": "wall-clock per search (s)",
    "joules": "energy per search (J)",
    "gpu_evals": "GPU evaluations per search",
}


def plot_tuning_history(trials: list[tuple[int, float]], name: str, direction: str,
                        path: str | Path, title: str = "") -> Path:
    """One objective's value per finished trial (dots) and the best so far (a step line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if trials:
        nums, vals = zip(*sorted(trials))
        ax.plot(nums, vals, "o", ms=3.5, alpha=0.6, label="trial")
        best, run = [], None
        for v in vals:
            run = v if run is None else (max(run, v) if direction == "maximize" else min(run, v))
            best.append(run)
        ax.step(nums, best, where="post", linewidth=1.5, label=f"best so far ({direction})")
        ax.legend(fontsize=8)
    ax.set(xlabel="trial", ylabel=OBJECTIVE_LABELS.get(name, name))
    ax.grid(alpha=0.3)
    return _save(fig, title, path)


def plot_tuning_front(points: list[tuple[int, float, float]], front: set[int],
                      names: tuple[str, str], path: str | Path, title: str = "") -> Path:
    """Two objectives of every finished trial, the Pareto front's trials marked and joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rest = [(x, y) for n, x, y in points if n not in front]
    best = sorted((x, y) for n, x, y in points if n in front)
    if rest:
        ax.plot(*zip(*rest), "o", ms=3.5, alpha=0.4, color="0.5", label="trial")
    if best:
        ax.plot(*zip(*best), "o-", ms=5, linewidth=1.2, label="Pareto front")
    ax.set(xlabel=OBJECTIVE_LABELS.get(names[0], names[0]),
           ylabel=OBJECTIVE_LABELS.get(names[1], names[1]))
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    return _save(fig, title, path)


def _save(fig, title: str, path) -> Path:
    """Title (wrapped), lay out, write as a PNG and close ``fig``."""
    import matplotlib.pyplot as plt

    fig.suptitle(textwrap.fill(title, 80), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
