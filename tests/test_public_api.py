"""The curated public surface: every name in ``opro.__all__`` resolves, and ``import opro`` is light."""

from __future__ import annotations

import subprocess
import sys

import opro


def test_all_names_resolve() -> None:
    for name in opro.__all__:
        assert getattr(opro, name) is not None, name


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        opro.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_is_lazy() -> None:
    code = "import sys, opro; print(sorted(m for m in ('llama_cpp', 'mlflow', 'llama_index', 'optuna', 'dspy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_all_matches_the_lazy_export_table() -> None:
    assert sorted(opro.__all__) == sorted(opro._EXPORTS)
