"""One place that removes secrets from anything opro writes or prints.

A URL can carry a credential in its userinfo (``https://user:KEY@host``) or in a query value
(``?api-key=KEY``); a mapping can carry one under a key such as ``api_key``. Every writer of
parameters, tags, exports, reports, CLI output and error messages goes through these functions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"

#: Keys whose values are secrets wherever they appear (mapping keys, query parameters).
SECRET_KEY = re.compile(r"(api[_-]?key|apikey|secret|password|passwd|token|auth|credential|signature|sig)", re.I)
#: Token counts (an answer's cost, opro.program.cost), not tokens: kept where the value is no string (a secret is).
COUNT_KEY = re.compile(r"(prompt|completion|baseline|total)?_?tokens", re.I)

# A URL in prose ends before the punctuation that follows it ("... at https://h/v1?key=K: refused"): that
# ": " belongs to the sentence, and would vanish into the redacted query value if it were matched.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+?(?=[.,;:!?)\]]*(?:[\s'\"<>]|$))")


def redact_url(url: str) -> str:
    """``url`` with the userinfo and every query value replaced by ``***``.

    Query values are all redacted, not only those under known secret names: a proxy may take its
    key under any name, and a query value is never needed to tell which server was used.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL.sub(REDACTED, url)
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return url  # nothing to hide; urlunsplit would also drop the empty netloc of sqlite:///path
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED) for k, _ in pairs], safe="*") if pairs else REDACTED
    fragment = REDACTED if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_text(text: str) -> str:
    """Every URL inside free text (an error message, a log line) redacted with :func:`redact_url`."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redact(value: Any) -> Any:
    """A copy of ``value`` safe to record: strings redacted, secret-named mapping keys dropped."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not SECRET_KEY.search(str(k)) or str(k).endswith("_env")
                or (COUNT_KEY.fullmatch(str(k)) is not None and not isinstance(v, str))}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


__all__ = ["REDACTED", "redact", "redact_text", "redact_url"]


class RedactingFilter(logging.Filter):
    """A handler filter that redacts every record's message (arguments included) before output."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
