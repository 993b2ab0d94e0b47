"""Writers of parameters, tags and exports go through opro.redaction (issue 11, part 6)."""

from __future__ import annotations

from opro.tracking import safe_params

KEY = "sk-test-0123456789"


def test_safe_params_redacts_userinfo_and_query_values_of_urls() -> None:
    out = safe_params({"models.task.base_url": f"https://user:{KEY}@host.example/v1?api-key={KEY}"})
    assert KEY not in out["models.task.base_url"]
    assert out["models.task.base_url"].startswith("https://***@host.example/v1?api-key=")
