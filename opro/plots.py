"""Plots from plain data (no opro types): what a person looks at instead of a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path) -> Path:
    """Lays out, writes and closes a matplotlib figure (closed so long runs do not pile figures up)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_optimism(points: Sequence[Mapping[str, Any]], *, path: Path, title: str | None = None) -> Path:
    """Search score vs validation (and, when known, held-out) score per prompt.

    ``points``: ``{"label", "search", "validation", "heldout" (optional), "returned" (bool)}``. The
    drop from the search bar to the others is the optimism of selecting on the search questions.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [("search", "search (in-sample)", "#9ecae1"), ("validation", "validation", "#3182bd"),
             ("heldout", "held-out", "#e6550d")]
    kinds = [k for k in kinds if any(p.get(k[0]) is not None for p in points)]
    width = 0.8 / max(1, len(kinds))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(points) + 2), 4), dpi=120)
    for j, (key, label, color) in enumerate(kinds):
        xs = [i + (j - (len(kinds) - 1) / 2) * width for i in range(len(points))]
        ys = [float(p[key]) if p.get(key) is not None else 0.0 for p in points]
        bars = ax.bar(xs, ys, width=width, label=label, color=color)
        for bar, p in zip(bars, points, strict=True):
            if p.get(key) is not None:
                ax.annotate(f"{p[key]:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p["label"] + (" (returned)" if p.get("returned") else "") for p in points], fontsize=8)
    ax.set_ylim(1.0, 5.4)
    ax.set_ylabel("mean judge score (1-5)")
    ax.set_title(title or "How much of the search gain survives on unseen questions")
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)


__all__ = ["plot_optimism", "save_figure"]
