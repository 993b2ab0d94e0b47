"""The QA prompt being optimized: an *instruction* plus a *base template*.

The base template is the one of LlamaIndex's OPRO notebook (``{context_str}`` and ``{query_str}``).
The instruction goes before it (the notebook's layout) or after the query (``position="after"``): then
every candidate instruction shares the context-and-query prefix, which a local backend can reuse
from its KV cache instead of re-reading the context.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from opro.errors import PromptError
from opro.program.configurations import Configuration, Settings
from opro.program.dimensions import DIMENSIONS, SETTINGS, Value

if TYPE_CHECKING:
    from llama_index.core.prompts import PromptTemplate

DEFAULT_BASE_TEMPLATE = "---------------------\n{context_str}\n---------------------\nQuery: {query_str}\nAnswer: "
DEFAULT_INSTRUCTION = (
    "You are a QA assistant. Context information is below. "
    "Given the context information and not prior knowledge, answer the query."
)
TEMPLATE_VARIABLES = ("context_str", "query_str")
#: The dimensions a template carries as settings beside its text, by name (:mod:`opro.program.dimensions`).
_SETTING_DIMENSIONS = tuple(d for d in DIMENSIONS if d.is_setting)
Position = Literal["before", "after"]

# What LlamaIndex's SafeFormatter treats as a template variable: ``{name}`` / ``{a.b}``.
_VARIABLE = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*(?:\.[a-zA-Z_][a-zA-Z0-9_]*)*)\}")
_ANSWER_CUE = "Answer:"


def _check_braces(text: str, what: str) -> None:
    depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise PromptError(f"{what} has an unmatched '}}' at character {i}: {text[max(0, i - 30) : i + 1]!r}")
    if depth:
        raise PromptError(f"{what} has {depth} unmatched '{{'; remove or balance the braces")


def validate_instruction(text: str) -> str:
    """Return the instruction stripped, or raise :class:`PromptError` if it would break the template.

    Refused: non-string or empty text, unbalanced braces, and template variables such as
    ``{context_str}`` or ``{anything}`` (the instruction must be plain text around the template).
    Balanced braces that are not variables (e.g. a JSON example) are allowed: LlamaIndex's formatter
    and :meth:`QATemplate.format` leave them as they are.
    """
    if not isinstance(text, str):
        raise PromptError(f"an instruction must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise PromptError("the instruction is empty")
    _check_braces(stripped, "the instruction")
    found = _VARIABLE.findall(stripped)
    if found:
        names = ", ".join("{" + n + "}" for n in dict.fromkeys(found))
        raise PromptError(
            f"the instruction contains template variable(s) {names}; the base template already holds "
            "{context_str} and {query_str}: write the instruction as plain text"
        )
    return stripped


def validate_base_template(base: str) -> str:
    if not isinstance(base, str) or not base.strip():
        raise PromptError("the base template is empty")
    _check_braces(base, "the base template")
    found = _VARIABLE.findall(base)
    for name in TEMPLATE_VARIABLES:
        if found.count(name) != 1:
            raise PromptError(
                f"the base template must contain {{{name}}} exactly once (found {found.count(name)}): {base!r}"
            )
    extra = sorted(set(found) - set(TEMPLATE_VARIABLES))
    if extra:
        raise PromptError(f"the base template has unknown variable(s) {extra}; allowed: {list(TEMPLATE_VARIABLES)}")
    return base


@dataclass(frozen=True)
class Demo:
    """A worked example: a question with its context and a good answer, shown to the task model in
    the same fields as the question it must answer (as DSPy gives each demonstration its fields),
    not pasted into the instruction, where small models answer the example instead of the question."""

    query: str
    context: str
    answer: str

    def __post_init__(self) -> None:
        for name in ("query", "context", "answer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise PromptError(f"a demonstration's {name} must be non-empty text, got {value!r}")
            # Written literally into the template: the template's own variables would be filled there.
            clash = [v for v in TEMPLATE_VARIABLES if "{" + v + "}" in value]
            if clash:
                raise PromptError(f"a demonstration's {name} contains the template variable {{{clash[0]}}}: "
                                  "remove it from the example")

    def to_json(self) -> dict[str, str]:
        return {"query": self.query, "context": self.context, "answer": self.answer}

    @classmethod
    def from_json(cls, data: Any, *, where: str = "a demonstration") -> Demo:
        if not isinstance(data, Mapping):
            raise PromptError(f"{where} must be an object with query, context and answer, got {data!r}")
        missing = [k for k in ("query", "context", "answer") if not isinstance(data.get(k), str)]
        if missing:
            raise PromptError(f"{where} has no text for {', '.join(missing)}")
        return cls(query=data["query"], context=data["context"], answer=data["answer"])


@dataclass(frozen=True)
class QATemplate:
    """An instruction placed into a base template, after any demonstrations. Empty instruction: the
    base template alone (with its demonstrations).

    Its settings (:data:`opro.program.dimensions.SETTINGS`: ``top_k``, ``answer_max_tokens``, ``chunk_size``
    and any other dimension the template carries) are what the prompt is answered with (None: the
    program's own): a search that opens them returns them with the wording, and a prompt is compared,
    exported and registered with them, since its scores were measured under them. They are one
    mapping, as in the :class:`~opro.program.configurations.Configuration` the template answers
    (:attr:`configuration`): adding a dimension adds no field here.
    """

    instruction: str = DEFAULT_INSTRUCTION
    base: str = DEFAULT_BASE_TEMPLATE
    position: Position = "before"
    #: Worked examples, each filled into the base template's fields before the question's own.
    demos: tuple[Demo, ...] = ()
    #: The settings it is answered with that differ from the program's own, by dimension name (``top_k``:
    #: retrieved chunks per question, ``answer_max_tokens``, ``chunk_size``, ``retriever``, ``task_model``).
    settings: Mapping[str, Value] = field(default_factory=Settings)

    def __post_init__(self) -> None:
        if self.position not in ("before", "after"):
            raise PromptError(f"position must be 'before' or 'after', got {self.position!r}")
        validate_base_template(self.base)
        if self.instruction != "":
            object.__setattr__(self, "instruction", validate_instruction(self.instruction))
        object.__setattr__(self, "demos", tuple(self.demos))
        _check_names(self.settings)
        object.__setattr__(self, "settings", Settings(self.settings))
        for d in _SETTING_DIMENSIONS:
            error = d.setting_error(self.setting(d.name))
            if error:
                raise PromptError(error)

    def setting(self, name: str) -> Value | None:
        """The value of setting ``name`` this prompt is answered with (None: the program's own)."""
        return self.settings.get(name)

    def int_setting(self, name: str) -> int | None:
        """The value of the integer setting ``name`` (``top_k``, ``answer_max_tokens``, ``chunk_size``), or None."""
        value = self.setting(name)
        return None if value is None else int(value)

    @property
    def configuration(self) -> Configuration:
        """Its instruction and settings as one value (named as the search and ``opro compare`` name it)."""
        return Configuration(self.instruction, self.settings)

    def to_json(self) -> dict[str, Any]:
        """The whole configuration: wording, frame, demonstrations and settings (what exports carry)."""
        return {"instruction": self.instruction, "base": self.base, "position": self.position,
                "demos": [d.to_json() for d in self.demos], **self.settings}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "the prompt") -> QATemplate:
        """The inverse of :meth:`to_json` (missing demos and settings: none)."""
        demos = data.get("demos") or ()
        if not isinstance(demos, list | tuple):
            raise PromptError(f"{where}: 'demos' must be a list of objects with query, context and answer")
        try:
            return cls(
                instruction=str(data.get("instruction", "")), base=str(data.get("base", DEFAULT_BASE_TEMPLATE)),
                position=data.get("position", "before"),
                demos=tuple(Demo.from_json(d, where=f"{where}: demos[{i}]") for i, d in enumerate(demos)),
            ).with_settings(**{k: data.get(k) for k in SETTINGS})
        except PromptError as exc:
            msg = str(exc)
            raise PromptError(msg if msg.startswith(where) else f"{where}: {msg}") from None

    def _demo_block(self) -> str:
        """The demonstrations as literal text: each one the base template filled with its context and
        question (one pass, so a value is never substituted into), followed by its answer."""
        def filled(d: Demo) -> str:
            values = {"context_str": d.context, "query_str": d.query}
            return _VARIABLE.sub(lambda m: values.get(m.group(1), m.group(0)), self.base)

        return "".join(f"{filled(d)}{d.answer.strip()}\n\n" for d in self.demos)

    def _assemble(self, instruction: str, base: str) -> str:
        demos = self._demo_block()
        if not instruction:
            return f"{demos}{base}"
        if self.position == "before":
            return f"{instruction}\n{demos}{base}"
        # After the context and the query, right before the answer cue, so the prefix up to the query
        # is identical for every candidate instruction.
        cut = base.rfind(_ANSWER_CUE)
        if cut < 0:
            return f"{demos}{base.rstrip()}\n{instruction}\n"
        head = base[:cut]
        if head and not head.endswith("\n"):
            head += "\n"
        return f"{demos}{head}{instruction}\n{base[cut:]}"

    @property
    def template_text(self) -> str:
        """The full template with ``{context_str}`` / ``{query_str}``.

        For LlamaIndex's formatter, which substitutes known ``{name}`` variables and leaves any other
        braces alone (it is not ``str.format``: braces are not doubled).
        """
        return self._assemble(self.instruction, self.base)

    def format(self, *, context_str: str, query_str: str) -> str:
        """The prompt text. Values are inserted literally (braces in documents or queries are safe)."""
        filled = self.base.replace("{context_str}", "\0C\0").replace("{query_str}", "\0Q\0")
        text = self._assemble(self.instruction, filled)
        values = {"C": context_str, "Q": query_str}
        # One pass, so a value that happens to contain the other marker is never substituted twice.
        return re.sub("\0([CQ])\0", lambda m: values[m.group(1)], text)

    def to_llama_index(self) -> PromptTemplate:
        """A LlamaIndex ``PromptTemplate`` (for ``update_prompts`` on a query engine)."""
        from llama_index.core.prompts import PromptTemplate
        from llama_index.core.prompts.prompt_type import PromptType

        return PromptTemplate(self.template_text, prompt_type=PromptType.QUESTION_ANSWER)

    def with_instruction(self, instruction: str) -> QATemplate:
        return dataclasses.replace(self, instruction=instruction)

    def with_demos(self, demos: Sequence[Demo]) -> QATemplate:
        return dataclasses.replace(self, demos=tuple(demos))

    def with_settings(self, **settings: Value | None) -> QATemplate:
        """This prompt answered with ``settings`` (by dimension name; one not given: the program's own)."""
        _check_names(settings)
        return dataclasses.replace(self, settings=Settings(settings))

    @classmethod
    def from_template_text(cls, text: str, *, base: str = DEFAULT_BASE_TEMPLATE) -> QATemplate:
        """Split a full template into instruction + base.

        Recognizes ``instruction + "\\n" + base`` and the *after* layout; LlamaIndex's default QA
        template (instruction sentences around the context block) is mapped to the default base with
        those sentences as the instruction. Any other template with both variables becomes the base
        with an empty instruction; so does one whose would-be instruction holds the frame filled again
        (demonstrations), which is no instruction.
        """
        frame = base.split("\n", 1)[0]
        if text.endswith(base) and (len(text) == len(base) or text[: -len(base)].endswith("\n")):
            instruction = text[: -len(base)].strip()
            if not (frame and frame in instruction):
                return cls(instruction=instruction, base=base)
        cut = base.rfind(_ANSWER_CUE)
        if cut >= 0:
            head, tail = base[:cut], base[cut:]
            if text.startswith(head) and text.endswith(tail):
                middle = text[len(head) : len(text) - len(tail)].strip()
                if middle and not _VARIABLE.search(middle):
                    return cls(instruction=middle, base=base, position="after")
        li = _parse_llama_index_default(text)
        if li is not None and base == DEFAULT_BASE_TEMPLATE and not (frame and frame in li):
            return cls(instruction=li, base=base)
        return cls(instruction="", base=validate_base_template(text))


def _check_names(settings: Mapping[str, Any]) -> None:
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise PromptError(f"a prompt has no setting {unknown[0]!r}; its settings: {', '.join(SETTINGS)}")

_LI_DEFAULT = re.compile(
    r"^(?P<pre>.*?)\n?-{5,}\n\{context_str\}\n-{5,}\n(?P<mid>.*?)\n?Query: \{query_str\}\nAnswer: ?$",
    re.S,
)


def _parse_llama_index_default(text: str) -> str | None:
    m = _LI_DEFAULT.match(text)
    if not m:
        return None
    parts = [p.strip() for p in (m.group("pre"), m.group("mid")) if p.strip()]
    joined = " ".join(parts)
    if not joined or _VARIABLE.search(joined):
        return None
    return joined


__all__ = [
    "DEFAULT_BASE_TEMPLATE",
    "DEFAULT_INSTRUCTION",
    "SETTINGS",
    "TEMPLATE_VARIABLES",
    "Demo",
    "Position",
    "QATemplate",
    "validate_base_template",
    "validate_instruction",
]
