"""How a configuration is named: its instruction, then in braces the settings it changes.

A candidate of the search is a configuration (an instruction and a value of each open dimension), not
an instruction: the initial instruction with ``top_k = 1`` is another candidate than the initial
configuration. Its name is what the search keys it by (the scorer, the study's records and validation
scores, the workers' claims, the validation design) and what ``opro compare`` accepts as a prompt:

    Answer the question.                          the initial configuration (its settings unchanged)
    Answer the question. {top_k=1}                the same wording with one retrieved chunk
    initial {top_k=1, answer_max_tokens=48}       (``opro compare``) a prompt source with two settings

The braces list only the values that differ from the initial configuration's, in the table's order
(:data:`opro.program.dimensions.DIMENSIONS`), so the initial configuration and every candidate of a
search without ``[search.space]`` are named by their instruction alone, as they always were. Values are
checked through the table: an unknown dimension or a value it does not take is refused, naming it and
what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from opro.errors import ConfigError
from opro.program.dimensions import DIMENSIONS, Dimension, Value, dimension

#: A trailing ``{name=value, ...}`` block: what :func:`split_name` reads as settings (a JSON example
#: in braces, ``{"a": 1}``, is no such block).
_BLOCK = re.compile(r"\s*\{\s*(\w+\s*=\s*[^{}=,\s][^{}=,]*(?:,\s*\w+\s*=\s*[^{}=,\s][^{}=,]*)*)\s*\}\s*$")


def changed(values: Mapping[str, Any], initial: Mapping[str, Any]) -> dict[str, Value]:
    """The values of ``values`` that differ from ``initial``'s (a dimension ``initial`` lacks counts
    as changed), in the table's order."""
    return {d.name: values[d.name] for d in DIMENSIONS
            if d.name in values and values[d.name] is not None and values[d.name] != initial.get(d.name)}


def settings_text(values: Mapping[str, Any]) -> str:
    """``top_k=1, answer_max_tokens=48``: the values in the table's order."""
    return ", ".join(f"{d.name}={values[d.name]}" for d in DIMENSIONS if d.name in values)


def name_of(instruction: str, values: Mapping[str, Any], initial: Mapping[str, Any] | None = None) -> str:
    """The name of the configuration with ``instruction`` and ``values``: the instruction, then in
    braces the values that differ from ``initial`` (None: all of them); the instruction alone when none does."""
    shown = changed(values, initial or {})
    return f"{instruction} {{{settings_text(shown)}}}" if shown else instruction


def parse_value(d: Dimension, text: str, *, where: str) -> Value:
    """``text`` as a value of ``d``; a :class:`ConfigError` naming ``where``, the value and what ``d`` takes."""
    text = text.strip()
    value: Value | None
    try:
        value = d.coerce(text) if d.kind != "float" or text.lower() not in ("nan", "inf", "-inf") else None
    except ValueError:
        value = None
    if d.kind == "int" and value is not None and str(value) != text.lstrip("+"):
        value = None  # 1.5 or 1e3 for an integer
    # What a template may carry (any positive number; the config's floors are the search's).
    error = f"must be {d.expects}" if value is None else d.setting_error(value) if d.is_setting else d.value_error(value)
    if error:
        shown = error.removeprefix(f"{d.name} ").removesuffix(f", got {value!r}").removesuffix(" or unset")
        raise ConfigError(f"{where}: {d.name} = {text!r} {shown}")
    assert value is not None
    return value


def parse_setting(text: str, *, where: str = "--set") -> tuple[str, Value]:
    """``name=value`` (``top_k=1``) as a dimension's name and value, checked through the table."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip() or not raw.strip():
        raise ConfigError(f"{where} {text!r}: write NAME=VALUE, e.g. top_k=1 (the dimensions: "
                          f"{', '.join(d.name for d in DIMENSIONS)})")
    try:
        d = dimension(name.strip())
    except ConfigError as exc:
        raise ConfigError(f"{where} {text!r}: {exc}") from None
    return d.name, parse_value(d, raw, where=f"{where} {text!r}")


def split_name(text: str, *, where: str = "the prompt") -> tuple[str, dict[str, Value]]:
    """A name read back: (the text before a trailing ``{name=value, ...}`` block, its settings); the
    text whole and no settings when it ends in no such block."""
    m = _BLOCK.search(text)
    if m is None:
        return text, {}
    values: dict[str, Value] = {}
    for item in m.group(1).split(","):
        name, value = parse_setting(item.strip(), where=where)
        if name in values:
            raise ConfigError(f"{where}: {name} is set twice in {m.group(0).strip()!r}")
        values[name] = value
    return text[: m.start()], values


__all__ = ["changed", "name_of", "parse_setting", "parse_value", "settings_text", "split_name"]
