"""opro.redaction: secrets out of URLs in free text, and the prose around them kept."""

from __future__ import annotations

import pytest

from opro.redaction import redact_text

KEY = "sk-test-0123456789"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The ": " after a URL belongs to the sentence; it used to vanish into the redacted query value.
        (f"rate limited by https://h.example/v1?api-key={KEY}: slow down",
         "rate limited by https://h.example/v1?api-key=***: slow down"),
        (f"see https://user:{KEY}@h.example/v1.", "see https://***@h.example/v1."),
        (f"(at http://h.example/a?q={KEY}&k=2), then", "(at http://h.example/a?q=***&k=***), then"),
        (f"https://h.example/v1?key={KEY}:more", "https://h.example/v1?key=***"),  # inside the URL: redacted
        ("sqlite:///a/b.db, as asked", "sqlite:///a/b.db, as asked"),
        (f"'https://user:{KEY}@h.example:8080/v1'", "'https://***@h.example:8080/v1'"),
    ],
)
def test_urls_in_text_lose_their_secrets_and_keep_the_punctuation_after_them(text: str, expected: str) -> None:
    assert redact_text(text) == expected
    assert KEY not in redact_text(text)
