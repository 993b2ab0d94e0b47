"""How a configuration is named: its instruction, then in braces the settings it changes.

A candidate of the search is a configuration (an instruction and a value of each open dimension), not
an instruction: the initial instruction with ``top_k = 1`` is another candidate than the initial
configuration. Its name is what the search keys it by (the scorer, the study's records and validation
scores, the workers' claims, the validation design) and what ``opro compare`` accepts as a prompt:

    Answer the question.                          the initial configuration (its settings unchanged)
    Answer the question. {top_k=1}                the same wording with one retrieved chunk
    initial {top_k=1, answer_max_tokens=48}       (``opro compare``) a prompt source with two settings

A configuration is one value, :class:`Configuration`: :meth:`Configuration.parse` reads the text
form (each setting, and each ``--set name=value``, through :func:`parse_setting`) and
:meth:`Configuration.name` writes it. The braces list only the values that differ from the initial
configuration's, in the table's order (:data:`opro.program.dimensions.DIMENSIONS`), so the initial configuration and every candidate of a
search without ``[search.space]`` are named by their instruction alone, as they always were. Values are
checked through the table: an unknown dimension or a value it does not take is refused, naming it and
what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from opro.errors import ConfigError
from opro.program.dimensions import DIMENSIONS, Dimension, Value, dimension

#: A trailing ``{name=value, ...}`` block: what :meth:`Configuration.parse` reads as settings (a JSON example
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


def parse_settings(texts: Iterable[str], *, where: str = "--set") -> dict[str, Value]:
    """``name=value`` texts (``opro compare --set``) as one mapping, in the table's order; a name given
    twice: the last value."""
    values: dict[str, Value] = {}
    for text in texts:
        name, value = parse_setting(text, where=where)
        values[name] = value
    return ordered(values)


def ordered(values: Mapping[str, Value | None]) -> dict[str, Value]:
    """``values`` set (not None) in the table's order; a :class:`ConfigError` for a name no dimension has."""
    for name in values:
        dimension(name)
    return {d.name: v for d in DIMENSIONS if (v := values.get(d.name)) is not None}


class Settings(dict[str, Value]):
    """Values of the table's dimensions, set (not None) and in the table's order: a read-only,
    hashable mapping, so the frozen values that hold one (:class:`Configuration`, a template) stay
    frozen. It reads, prints and serializes as the dict it is."""

    def __init__(self, values: Mapping[str, Value | None] | Iterable[tuple[str, Value | None]] | None = None, /) -> None:
        # pairs too, as dict() takes them: dataclasses.asdict rebuilds a dict subclass from its items
        super().__init__(ordered(dict(values or {})))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Settings, (dict(self),))

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("settings are read-only: build new ones (with_settings)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only  # type: ignore[assignment]


@dataclass(frozen=True)
class Configuration:
    """A configuration: an instruction (for ``opro compare``, a prompt source such as ``initial``) and
    the values it gives dimensions of the table (:data:`opro.program.dimensions.DIMENSIONS`, the task
    model included), kept in the table's order. Its text form is its name (:meth:`name`,
    ``str(configuration)``), read back by :meth:`parse`."""

    instruction: str
    #: Dimension name -> value (:class:`Settings`; a value of None is no value).
    settings: Mapping[str, Value] = field(default_factory=Settings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", Settings(self.settings))

    @classmethod
    def parse(cls, text: str, *, where: str = "the prompt") -> Configuration:
        """A name read back: the text before a trailing ``{name=value, ...}`` block and its settings,
        each checked through the table; the text whole and no settings when it ends in no such block."""
        m = _BLOCK.search(text)
        if m is None:
            return cls(text)
        values: dict[str, Value] = {}
        for item in m.group(1).split(","):
            name, value = parse_setting(item.strip(), where=where)
            if name in values:
                raise ConfigError(f"{where}: {name} is set twice in {m.group(0).strip()!r}")
            values[name] = value
        return cls(text[: m.start()], values)

    def with_settings(self, settings: Mapping[str, Value]) -> Configuration:
        """This configuration with ``settings`` added (a value it gives too: the one of ``settings``)."""
        return Configuration(self.instruction, {**self.settings, **settings})

    def name(self, initial: Mapping[str, Any] | None = None) -> str:
        """The text form: the instruction, then in braces the values that differ from ``initial``'s
        (None: all of them); the instruction alone when none does."""
        shown = changed(self.settings, initial or {})
        return f"{self.instruction} {{{settings_text(shown)}}}" if shown else self.instruction

    def __str__(self) -> str:
        return self.name()


__all__ = ["Configuration", "Settings", "changed", "ordered", "parse_setting", "parse_settings", "parse_value", "settings_text"]
