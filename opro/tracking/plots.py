"""Every plot opro draws, from plain data (no opro types): what a person looks at instead of a table.

The modules that own the data (optimizer, compare, calibration) turn their results into numbers and
labels and call these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def plot_trajectory(
    *,
    steps: Sequence[int],
    scores: Sequence[float | None],
    pruned: Sequence[bool],
    path: Path,
    title: str = "OPRO: search score by step (in-sample: the optimization questions)",
    n_questions: int | None = None,
) -> Path:
    """Every candidate as a point (pruned ones hollow), best-so-far as a line, like the OPRO paper.
    Every score here is in-sample (the search selected on these questions): the axis says so, and
    the validated figures are in ``optimism.png`` and the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    done = [(s, v) for s, v, p in zip(steps, scores, pruned, strict=True) if v is not None and not p]
    cut = [(s, v) for s, v, p in zip(steps, scores, pruned, strict=True) if v is not None and p]
    def spread(points: list[tuple[int, float]]) -> list[float]:
        # Candidates of one step often tie; fan them out a little so every point shows.
        seen: dict[tuple[int, float], int] = {}
        xs = []
        for s, v in points:
            k = seen.get((s, v), 0)
            seen[(s, v)] = k + 1
            xs.append(s + 0.06 * ((k + 1) // 2) * (1 if k % 2 else -1))
        return xs

    if done:
        ax.scatter(spread(done), [v for _, v in done], s=30, alpha=0.75, label="candidate")
    if cut:
        ax.scatter(spread(cut), [v for _, v in cut], s=30, facecolors="none", edgecolors="grey",
                   label="pruned (partial mean)")
    if done:
        by_step: dict[int, float] = {}
        for s, v in done:
            by_step[s] = max(v, by_step.get(s, float("-inf")))
        best, xs, ys = float("-inf"), [], []
        for s in sorted(by_step):
            best = max(best, by_step[s])
            xs.append(s)
            ys.append(best)
        ax.step(xs, ys, where="post", color="C3", linewidth=2, label="best so far (in-sample, biased upward)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step (0 = initial instructions)")
    on = f"{n_questions} optimization questions" if n_questions else "the optimization questions"
    ax.set_ylabel(f"search score: mean judge score (1-5)\non {on}", fontsize=8)
    ax.set_ylim(0.8, 5.2)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, path)


def plot_paired_scores(
    *,
    labels: Sequence[str],
    scores: Sequence[Sequence[float | None]],
    means: Sequence[tuple[float, float, float] | None],
    baseline: int,
    differences: Sequence[tuple[float, float, float] | None],
    threshold: float,
    title: str,
    baseline_label: str,
    path: Path,
) -> Path:
    """Left: each prompt's per-question scores (jittered) with its mean and CI (estimate, low, high).
    Right: each prompt's paired differences against prompt ``baseline``, with the mean difference and
    its CI (``differences[i]``; None for the baseline itself). Scores of one question share an index."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rng = np.random.default_rng(0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for i, (prompt_scores, mean) in enumerate(zip(scores, means, strict=True)):
        valid = np.array([s for s in prompt_scores if s is not None], dtype=float)
        if len(valid):
            left.scatter(i + rng.uniform(-0.18, 0.18, len(valid)), valid + rng.uniform(-0.08, 0.08, len(valid)),
                         s=16, alpha=0.5, color=f"C{i % 10}")
        if mean is not None:
            est, low, high = mean
            left.errorbar([i + 0.3], [est], yerr=[[est - low], [high - est]], fmt="o", color="black", capsize=4)
    left.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    left.set_xticks(range(len(labels)), labels, fontsize=8)
    left.set_ylim(0.6, 5.4)
    left.set_ylabel("judge score (1-5)")
    left.set_title(title, fontsize=10)
    others = [(i, d) for i, d in enumerate(differences) if d is not None]
    for k, (i, (est, low, high)) in enumerate(others):
        diffs = np.array([x - y for x, y in zip(scores[i], scores[baseline], strict=True) if x is not None and y is not None])
        if len(diffs):
            right.scatter(k + rng.uniform(-0.18, 0.18, len(diffs)), diffs + rng.uniform(-0.08, 0.08, len(diffs)),
                          s=16, alpha=0.5, color=f"C{i % 10}")
            right.errorbar([k + 0.3], [est], yerr=[[est - low], [high - est]], fmt="o", color="black", capsize=4)
    right.axhline(0.0, color="grey", linewidth=1)
    right.set_xticks(range(len(others)), [labels[i] for i, _ in others], fontsize=8)
    right.set_ylim(-4.4, 4.4)
    right.set_ylabel(f"score - {baseline_label}")
    right.set_title("paired differences vs baseline, mean and CI", fontsize=10)
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)




def plot_score_histograms(groups: Mapping[str, Sequence[float]], *, path: Path, title: str) -> Path:
    """Histogram of scores per group (0.25-wide bins over 1..5: logit scores are continuous)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    bins = [1 + 0.25 * k for k in range(17)]
    for name, scores in groups.items():
        if scores:
            ax.hist(scores, bins=bins, alpha=0.55, label=f"{name} (n={len(scores)})")
    ax.set_xlabel("judge score")
    ax.set_ylabel("answers")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


__all__ = ["ParetoPoint", "plot_optimism", "plot_paired_scores", "plot_pareto", "plot_score_histograms", "plot_trajectory", "save_figure"]


@dataclass(frozen=True, kw_only=True)
class ParetoPoint:
    """One candidate on :func:`plot_pareto`: its label, search score and cost per answer, and its marks."""

    label: str
    score: float
    cost: float
    front: bool = False
    initial: bool = False
    returned: bool = False
    #: Drawn faded at its running mean (its score and cost on the questions it was asked).
    pruned: bool = False


def plot_pareto(points: Sequence[ParetoPoint], *, path: Path, cost_label: str, title: str | None = None) -> Path:
    """Quality against cost per answer, one dot per candidate, the quality-cost front joined. The initial
    and the returned configurations are rings around their dots, so a front dot under them stays visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    pruned = [p for p in points if p.pruned]
    rest = [p for p in points if not p.front and not p.pruned]
    front = sorted((p for p in points if p.front), key=lambda p: p.cost)
    if pruned:
        ax.scatter([p.cost for p in pruned], [p.score for p in pruned], s=22, marker="o", facecolors="none",
                   edgecolors="#9e9e9e", alpha=0.6, label="pruned (running mean)", zorder=2)
    if rest:
        ax.scatter([p.cost for p in rest], [p.score for p in rest], s=22, color="#969696", label="candidate",
                   zorder=2)
    if front:
        ax.step([p.cost for p in front], [p.score for p in front], where="post", color="#3182bd", lw=1, zorder=3)
        ax.scatter([p.cost for p in front], [p.score for p in front], s=30, color="#3182bd",
                   label="quality-cost front", zorder=5)
    for mark, marker, color, size, label in ((lambda p: p.initial, "s", "#252525", 150, "initial configuration"),
                                             (lambda p: p.returned, "o", "#e6550d", 260, "returned")):
        shown = [p for p in points if mark(p)]
        if shown:
            ax.scatter([p.cost for p in shown], [p.score for p in shown], s=size, marker=marker,
                       facecolors="none", edgecolors=color, linewidths=1.5, label=label, zorder=4)
    ax.set_xlabel(f"cost per answer: {cost_label}", fontsize=9)
    ax.set_ylabel("search score (1-5, in-sample)")
    ax.set_title(title or "Quality and cost of the search's candidates", fontsize=10)
    ax.margins(x=0.08, y=0.12)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)
