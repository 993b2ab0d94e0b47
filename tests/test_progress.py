"""Progress where stderr is a log: a line at the start, every so often, and at the end."""

from __future__ import annotations

import re

import pytest

import opro.progress
from opro.progress import progress_bar


def test_a_log_gets_progress_lines_with_counts_and_an_eta(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opro.progress, "LINE_EVERY_S", 0.0)  # a line per advance
    with progress_bar("judging", total=4) as bar:
        bar.advance()
        bar.add_total(4)
        bar.advance(3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("judging: 0/4 (0%), 0:00 elapsed")
    assert re.match(r"judging: 1/4 \(25%\), 0:00 elapsed, eta 0:00$", lines[1])
    assert lines[2].startswith("judging: 4/8 (50%)")
    assert lines[-1].startswith("judging: 4/8 (50%)") and "eta" in lines[-1]


def test_a_log_is_not_flooded_between_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar("answering", total=1000) as bar:
        for _ in range(1000):
            bar.advance()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [lines[0], lines[-1]] and lines[-1].startswith("answering: 1000/1000 (100%)")
    assert "eta" not in lines[-1]


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar("quiet", total=3, enabled=False) as bar:
        bar.advance(3)
    assert capsys.readouterr().err == ""


def test_skipped_work_lowers_the_total_and_is_not_counted_as_done(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pruned candidate's questions leave the total instead of being counted as done (which made the
    measured rate, and so the ETA, too fast); the total never falls below the work done."""
    monkeypatch.setattr(opro.progress, "LINE_EVERY_S", 0.0)
    with progress_bar("step 1", total=10) as bar:
        bar.advance(2)
        bar.skip(4)
        bar.advance(2)
        bar.skip(100)
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("step 1: 2/10 (20%)")
    assert lines[2].startswith("step 1: 4/6 (67%)")
    assert lines[-1].startswith("step 1: 4/4 (100%)")
