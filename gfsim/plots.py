"""Figures (matplotlib, headless): reliability diagrams and risk-coverage curves."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_scores"]


def plot_scores(curves: list[dict], path: str | Path) -> Path:
    """``curves``: per forecaster {name, reliability: [...buckets], coverage, risk}. Writes a
    two-panel PNG (reliability diagram, risk-coverage curve)."""
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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
