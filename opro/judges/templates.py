"""Judge prompts as data: the correctness templates (:class:`JudgeTemplate`, built-in and from
files) and LlamaIndex's faithfulness / relevancy templates. The parsers that read the replies are in
:mod:`opro.judges.parsing`."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opro.errors import ConfigError, PromptError
from opro.judges.parsing import OutputFormat
from opro.llm import Message

# --- built-in templates ----------------------------------------------------------------------------

# LlamaIndex's CorrectnessEvaluator prompt is the library's own object, read at run time (so it stays in
# sync with the installed llama-index-core); see _llamaindex_correctness().

# Absolute grading in the style of Prometheus 2 (feedback, then "[RESULT] N"), in our own words, with
# our correctness rubric. prometheus-eval is not a dependency: its prompt is not copied here.
_PROMETHEUS_SYSTEM = (
    "You are a fair, strict grader. You grade one response against a reference answer and a score rubric, "
    "and you apply the rubric the same way to every response."
)

_PROMETHEUS_USER = """Grade the response to the instruction below.
First write a short feedback that applies the score rubric to the response (not a general opinion), then
give an integer score from 1 to 5. Write the result as: "Feedback: <feedback> [RESULT] <score>".

Instruction: {query}

Response to grade: {generated_answer}

Reference answer (scores 5): {reference_answer}

Score rubric: is the response correct and factual compared with the reference answer?
Score 1: the response answers a different question, contradicts the reference, or gives no answer.
Score 2: the response is on topic but its key facts differ from the reference.
Score 3: the response is partly correct: some key facts of the reference are missing or wrong.
Score 4: the response agrees with the reference, with a minor omission or imprecision.
Score 5: the response states the key facts of the reference and nothing contradicts it.

Feedback: """

# Our short rubric: the two failures a small judge misses ("answers a different question",
# "contradicts the reference") are named as score 1, and the judge is told to compare facts, not
# fluency. Short on purpose: it is paid on every candidate and question.
_RUBRIC_SYSTEM = """You check an answer against the reference answer of a question. Compare facts, not wording or style.
Score from 1 to 5:
5 = states the key facts of the reference; nothing contradicts it.
4 = agrees with the reference but misses a detail or is vague.
3 = partly right: some key facts of the reference are missing or wrong.
2 = on topic, but its key facts differ from the reference.
1 = answers a different question, contradicts the reference, or gives no answer.
A fluent, true-sounding answer that does not answer this question with the reference's facts scores 1."""

_RUBRIC_USER = """Question: {query}

Reference answer: {reference_answer}

Answer to grade: {generated_answer}"""

# One short worked example per score: small judges need anchors (Databricks: GPT-3.5 became usable
# as a judge only with one example per score). Kept short because the embedded judge runs on CPU.
_FEWSHOT_SYSTEM = """You grade answers of a question answering chatbot against a reference answer.
Give an integer score from 1 to 5:
5 = correct and complete: states the key facts of the reference, no mistakes.
4 = correct, but misses a minor detail or is imprecise.
3 = partly correct: some key facts right, others missing or wrong.
2 = on topic but mostly wrong, or misses the key facts.
1 = irrelevant, no answer, or contradicts the reference.

Examples (question: "When was the Eiffel Tower completed and how tall is it?", reference: "It was completed in 1889 and is about 330 metres tall."):
Answer: "Finished in 1889, it stands about 330 m high." -> Score: 5
Answer: "It was completed in 1889 and is roughly 300 metres tall." -> Score: 4
Answer: "It was completed in 1889." -> Score: 3
Answer: "It was completed in 1925 and is 100 metres tall." -> Score: 2
Answer: "Paris is the capital of France." -> Score: 1

Reply with the score on the first line as "Score: N", then one sentence of reasoning."""

_FEWSHOT_USER = """Question: {query}

Reference answer: {reference_answer}

Answer to grade: {generated_answer}"""

# The side-by-side judge (:mod:`opro.judges.sidebyside`): one call sees both answers of a question and
# scores each on the rubric's scale, so a judge's drift between two separate calls cancels in their
# difference. Our own words, the rubric's scale; the answers' order is the judge's (seeded per question).
SIDE_BY_SIDE_SYSTEM = """You check two answers to the same question against its reference answer. Compare facts, not wording or style.
Score each answer from 1 to 5, on its own merits, on the same scale:
5 = states the key facts of the reference; nothing contradicts it.
4 = agrees with the reference but misses a detail or is vague.
3 = partly right: some key facts of the reference are missing or wrong.
2 = on topic, but its key facts differ from the reference.
1 = answers a different question, contradicts the reference, or gives no answer.
Two answers that say the same facts get the same score, whichever comes first."""

SIDE_BY_SIDE_USER = """Question: {query}

Reference answer: {reference_answer}

Answer A: {answer_a}

Answer B: {answer_b}

Respond only with a JSON object {{"score_a": <integer 1-5>, "score_b": <integer 1-5>}}."""


PLACEHOLDERS = ("query", "reference_answer", "generated_answer")
_PLACEHOLDER_RE = re.compile(r"\{(query|reference_answer|generated_answer)\}")


def _fill(template: str, values: Mapping[str, str]) -> str:
    # Substitute only our placeholders so templates may contain other braces (JSON examples).
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class JudgeTemplate:
    """A correctness-judge prompt: system text, user template, and how the reply is laid out.

    ``user`` uses the placeholders ``{query}``, ``{reference_answer}`` and ``{generated_answer}``.
    ``output_format`` is a parser hint: ``score_first`` (the score is the first line, as in
    LlamaIndex), ``result_tag`` (``[RESULT] N``), ``score_label`` (``Score: N``) or ``any``.
    """

    name: str
    system: str
    user: str
    output_format: OutputFormat = "any"

    def __post_init__(self) -> None:
        if "{generated_answer}" not in self.user and "{generated_answer}" not in self.system:
            raise PromptError(
                f"judge template {self.name!r} has no {{generated_answer}} placeholder: the judge would never "
                "see the answer. Use {query}, {reference_answer} and {generated_answer}."
            )
        if self.output_format not in ("score_first", "result_tag", "score_label", "any"):
            raise PromptError(
                f"judge template {self.name!r}: output_format {self.output_format!r} is not one of "
                "score_first, result_tag, score_label, any"
            )

    def render(
        self, *, query: str, answer: str, reference: str | None, json_instruction: str | None = None
    ) -> tuple[Message, ...]:
        values = {
            "query": query,
            "generated_answer": answer,
            "reference_answer": reference if reference else "(NO REFERENCE ANSWER SUPPLIED)",
        }
        user = _fill(self.user, values)
        if json_instruction:
            user = f"{user.rstrip()}\n\n{json_instruction}"
        messages: list[Message] = []
        if self.system.strip():
            messages.append(Message("system", _fill(self.system, values)))
        messages.append(Message("user", user))
        return tuple(messages)

    @classmethod
    def from_file(cls, path: str | Path) -> JudgeTemplate:
        """Load a template from TOML (keys ``system``, ``user``, optional ``name``, ``output_format``)
        or from a plain text file used as the user template (no system message)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # a file of other bytes than UTF-8 text too
            raise ConfigError(f"cannot read judge template file {p}: {exc}") from exc
        if p.suffix.lower() == ".toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"judge template {p} is not valid TOML: {exc}") from exc
            unknown = set(data) - {"name", "system", "user", "output_format"}
            if unknown or "user" not in data:
                raise ConfigError(
                    f"judge template {p}: needs key 'user' (and optional 'system', 'name', 'output_format'); "
                    f"unknown keys: {sorted(unknown)}"
                )
            return cls(
                name=str(data.get("name", p.stem)),
                system=str(data.get("system", "")),
                user=str(data["user"]),
                output_format=data.get("output_format", "any"),
            )
        return cls(name=p.stem, system="", user=text, output_format="any")


def _module_strings(module: str, names: tuple[str, ...]) -> tuple[str, ...] | None:
    """The string constants ``names`` of ``module`` (for a ``PromptTemplate("...")``, its text), read
    from the module's source file without importing it.

    ``None`` when the file or a plain string literal is not found (then the caller imports)."""
    package, _, leaf = module.rpartition(".")
    try:
        top, _, rest = package.partition(".")
        spec = importlib.util.find_spec(top)  # the top-level (namespace) package only: no package code runs
        if spec is None or not spec.submodule_search_locations:
            return None
        for location in spec.submodule_search_locations:
            path = Path(location, *rest.split("."), f"{leaf}.py") if rest else Path(location, f"{leaf}.py")
            if path.is_file():
                break
        else:
            return None
        found: dict[str, str] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "PromptTemplate":
                value = value.args[0] if len(value.args) == 1 and not value.keywords else value  # its template text
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found[node.targets[0].id] = value.value
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    return tuple(found[n] for n in names) if all(n in found for n in names) else None


def _llamaindex_correctness() -> JudgeTemplate:
    """LlamaIndex's CorrectnessEvaluator system and user templates, the installed library's own strings.

    Read from its source rather than imported: importing ``llama_index.core`` costs about 3 s, which a
    run whose chunks are cached (resume, compare, a second worker) otherwise never pays."""
    names = ("DEFAULT_SYSTEM_TEMPLATE", "DEFAULT_USER_TEMPLATE")
    strings = _module_strings("llama_index.core.evaluation.correctness", names)
    if strings is None:  # an installed layout we do not recognise: import it
        from llama_index.core.evaluation import correctness

        strings = (correctness.DEFAULT_SYSTEM_TEMPLATE, correctness.DEFAULT_USER_TEMPLATE)
    return JudgeTemplate("llamaindex", strings[0], strings[1], "score_first")


BUILTIN_TEMPLATES: dict[str, JudgeTemplate] = {
    "llamaindex": _llamaindex_correctness(),
    "prometheus": JudgeTemplate("prometheus", _PROMETHEUS_SYSTEM, _PROMETHEUS_USER, "result_tag"),
    "fewshot": JudgeTemplate("fewshot", _FEWSHOT_SYSTEM, _FEWSHOT_USER, "score_label"),
    "rubric": JudgeTemplate("rubric", _RUBRIC_SYSTEM, _RUBRIC_USER, "any"),
}


def get_template(template: str | Path | JudgeTemplate) -> JudgeTemplate:
    """A built-in template by name, a :class:`JudgeTemplate`, or a TOML / text file path."""
    if isinstance(template, JudgeTemplate):
        return template
    if isinstance(template, str) and template in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[template]
    path = Path(template)
    if path.is_file():
        return JudgeTemplate.from_file(path)
    raise ConfigError(
        f"unknown judge template {str(template)!r}: use one of {sorted(BUILTIN_TEMPLATES)} or a path to a "
        ".toml / .txt template file"
    )


# --- YES/NO judges (faithfulness, relevancy) ----------------------------------------------------------

# LlamaIndex's FaithfulnessEvaluator / RelevancyEvaluator default templates: the library's own
# PromptTemplate texts, read at run time from its source (as the correctness template above).
def _llamaindex_yes_no_templates() -> tuple[str, str, str, str]:
    names = ("DEFAULT_EVAL_TEMPLATE", "DEFAULT_REFINE_TEMPLATE")
    faith = _module_strings("llama_index.core.evaluation.faithfulness", names)
    rel = _module_strings("llama_index.core.evaluation.relevancy", names)
    if faith is not None and rel is not None:
        return faith[0], faith[1], rel[0], rel[1]
    from llama_index.core.evaluation import faithfulness, relevancy

    return (
        faithfulness.DEFAULT_EVAL_TEMPLATE.template,
        faithfulness.DEFAULT_REFINE_TEMPLATE.template,
        relevancy.DEFAULT_EVAL_TEMPLATE.template,
        relevancy.DEFAULT_REFINE_TEMPLATE.template,
    )


FAITHFULNESS_EVAL, FAITHFULNESS_REFINE, RELEVANCY_EVAL, RELEVANCY_REFINE = _llamaindex_yes_no_templates()


__all__ = [
    "BUILTIN_TEMPLATES",
    "FAITHFULNESS_EVAL",
    "FAITHFULNESS_REFINE",
    "PLACEHOLDERS",
    "RELEVANCY_EVAL",
    "RELEVANCY_REFINE",
    "SIDE_BY_SIDE_SYSTEM",
    "SIDE_BY_SIDE_USER",
    "JudgeTemplate",
    "get_template",
]
