"""The browser check: the MLflow UI, rendered by headless Chromium, shows the comparison question by question.

Chromium is a system package (Debian's ``chromium``): where it is missing these tests are skipped,
naming it and the command that installs it; in CI (``CI`` set, and .ci/run installs it) they fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import mlflow_client as _client
from fakes import unavailable

from opro.errors import OproError


@pytest.fixture
def chromium() -> str:
    """Chromium's executable (or :func:`fakes.unavailable`, naming the package)."""
    from uicheck import find_chromium

    try:
        return find_chromium()
    except OproError as exc:
        unavailable(f"the browser check needs Chromium: {exc}")


def test_the_evaluation_run_comparison_page_shows_every_question(
    chromium: str, genai_compared: tuple[Path, Any, Any], tmp_path: Path
) -> None:
    from uicheck import check_evaluation_ui

    config, report, saved = genai_compared
    client = _client(config)
    baseline, best = saved.evaluation_run_ids
    exp_id = client.get_run(best).info.experiment_id
    shot = tmp_path / "compare.png"
    check = check_evaluation_ui(
        tracking_uri=f"sqlite:///{config.parent / 'out' / 'mlflow.db'}",
        experiment_id=exp_id,
        run_id=best,
        compare_to=baseline,
        expect=[*report.questions, "correctness"],
        screenshot_path=shot,
    )
    assert check.ok, f"{check.url}: the rendered page ({len(check.dom)} chars) lacks {list(check.missing)[:3]}"
    # one judge-assessment cell per question row, plus the column header
    assert check.dom.count("correctness_assessment_column") >= len(report.questions) + 1
    assert "compare pair: best" in check.dom and "compare pair: initial" in check.dom
    assert shot.stat().st_size > 10_000


def test_the_ui_shows_the_datasets_and_each_evaluation_runs_prompt_version(
    chromium: str, genai_compared: tuple[Path, Any, Any],
) -> None:
    """The rest of what a user of MLflow 3 looks for, as the browser renders it: the experiment's
    evaluation datasets (one per split), and on each compared prompt's evaluation run the registered
    prompt version it is linked to and the dataset it ran on."""
    from uicheck import check_pages

    config, _, saved = genai_compared
    client = _client(config)
    exp_id = client.get_run(saved.evaluation_run_ids[0]).info.experiment_id
    datasets = sorted(d.name for d in client.search_datasets(experiment_ids=[exp_id]))
    assert len(datasets) == 4
    pages: dict[str, list[str]] = {f"experiments/{exp_id}/datasets": datasets}
    for run_id in saved.evaluation_run_ids:
        tags = client.get_run(run_id).data.tags
        name, version = tags["opro.prompt_uri"].removeprefix("prompts:/").split("/")
        heldout = next(d for d in datasets if ".heldout." in d)
        pages[f"experiments/{exp_id}/runs/{run_id}"] = ["Registered prompts", f"{name} (v{version})", "Datasets", heldout]
    checks = check_pages(tracking_uri=f"sqlite:///{config.parent / 'out' / 'mlflow.db'}", pages=pages)
    for check in checks.values():
        assert check.ok, f"{check.url}: the rendered page ({len(check.dom)} chars) lacks {list(check.missing)}"


def test_a_question_with_quotes_is_found_as_the_ui_renders_it_in_json() -> None:
    from uicheck import _on_page

    q = 'How does the "with" statement differ from the "try" statement?'
    dom = '<td>{ "question": "How does the \\"with\\" statement differ from the \\"try\\" statement?" }</td>'
    assert _on_page(q, dom)
    assert _on_page("plain question?", "<td>plain question?</td>")
    assert not _on_page('What does "if" do?', dom)
