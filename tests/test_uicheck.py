"""The browser check: the MLflow UI, rendered by headless Chromium, shows the comparison question by question.

Chromium is part of the test environment (.ci/run installs Debian's ``chromium``): when it is
missing the test fails, saying how to install it, rather than skipping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import mlflow_client as _client

from opro.errors import OproError


def test_the_evaluation_run_comparison_page_shows_every_question(
    genai_compared: tuple[Path, Any, Any], tmp_path: Path
) -> None:
    from opro.uicheck import check_evaluation_ui, find_chromium

    try:
        find_chromium()
    except OproError as exc:
        pytest.fail(f"the browser check needs Chromium: {exc}")
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


def test_a_question_with_quotes_is_found_as_the_ui_renders_it_in_json() -> None:
    from opro.uicheck import _on_page

    q = 'How does the "with" statement differ from the "try" statement?'
    dom = '<td>{ "question": "How does the \\"with\\" statement differ from the \\"try\\" statement?" }</td>'
    assert _on_page(q, dom)
    assert _on_page("plain question?", "<td>plain question?</td>")
    assert not _on_page('What does "if" do?', dom)
