"""Synthetic golden datasets: questions per chunk, then a reference answer per question, by the strong model.

The prompts are LlamaIndex's dataset-generator prompts (the reference notebook's "Teacher/Professor"
question query and the default text-QA template), with one line added asking for a numbered list,
which small local models need to produce parseable output. Calls run at temperature 0 through a
:class:`~opro.llm.ChatClient`, so with a call cache a rerun (or a resumed, interrupted run) is free.

Dropped: empty questions, duplicates and near-duplicates (token Jaccard or ``difflib`` ratio), and
answers saying the context does not contain the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from opro.data.dataset import Example, GoldenDataset, NearDuplicates, is_near_duplicate
from opro.data.documents import Chunk
from opro.errors import ConfigError, DataError
from opro.llm import ChatClient, Completion, Message
from opro.progress import ProgressBar, progress_bar

# The question query LlamaIndex's DatasetGenerator builds inline (the reference notebook's
# "Teacher/Professor" query). The library does not export it, so it cannot be loaded from there; kept
# word for word so that generated datasets (and the README's figures) stay reproducible.
DEFAULT_QUESTION_QUERY = (
    "You are a Teacher/Professor. Your task is to setup {num_questions_per_chunk} questions for an upcoming "
    "quiz/examination. The questions should be diverse in nature across the document. Restrict the questions "
    "to the context information provided."
)


def _llamaindex_prompts() -> tuple[str, str]:
    """LlamaIndex's question-generation and text-QA prompt texts, the library's own objects."""
    from llama_index.core.evaluation import dataset_generation
    from llama_index.core.prompts import default_prompts

    return dataset_generation.DEFAULT_QUESTION_GENERATION_PROMPT, default_prompts.DEFAULT_TEXT_QA_PROMPT_TMPL


_LI_QUESTION_PROMPT, _LI_TEXT_QA_PROMPT = _llamaindex_prompts()
# LlamaIndex's DEFAULT_QUESTION_GENERATION_PROMPT plus our output-format line (small local models need
# it to produce a parseable list).
DEFAULT_QUESTION_TEMPLATE = (
    _LI_QUESTION_PROMPT
    + "Write exactly {num_questions_per_chunk} questions, one per line, numbered 1., 2., ... and nothing else."
)
# LlamaIndex's DEFAULT_TEXT_QA_PROMPT_TMPL (what its generator answers with).
DEFAULT_ANSWER_TEMPLATE = _LI_TEXT_QA_PROMPT

_NOT_IN_CONTEXT = re.compile(
    r"(context|text|passage|document|information provided)[^.]{0,40}\b(does not|doesn't|do not|did not|is not|isn't)\b"
    r"[^.]{0,30}\b(contain|provide|mention|include|specify|state|say|give|discuss|cover|address|describe)"
    r"|\bnot\s+(mentioned|provided|stated|specified|found|included|given|discussed|available|covered)\b[^.]{0,30}"
    r"\b(in|by)\s+the\s+(context|text|passage|document|information)"
    r"|\bno\s+(relevant\s+)?information\s+(about|on|regarding)"
    r"|\b(cannot|can't|can not|unable to)\s+(be\s+)?(answer|determine|find|infer)"
    r"|\bi\s+(don't|do not)\s+know\b"
    r"|\bnot\s+in\s+(the\s+)?context\b",
    re.I,
)
_NUMBERING = re.compile(r"^\s*(?:[-*•]\s*)?(?:\(?(?:q(?:uestion)?\s*)?\d{1,2}[.):]\s*|[-*•]\s+)", re.I)

DropReason = Literal["empty", "duplicate", "near-duplicate", "not-in-context", "empty-answer"]


def says_not_in_context(answer: str) -> bool:
    """Whether an answer says the context lacks the information."""
    return bool(_NOT_IN_CONTEXT.search(answer))


def parse_questions(text: str, *, limit: int | None = None) -> list[str]:
    """Questions from a model's numbered / bulleted / one-per-line reply."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip().strip('"').strip()
        if not line:
            continue
        had_marker = bool(_NUMBERING.match(line))
        line = _NUMBERING.sub("", line).strip().strip("*").strip()
        if not line or line.endswith(":"):  # headings such as "Questions:"
            continue
        if not (line.endswith("?") or had_marker):
            continue
        out.append(line)
        if limit is not None and len(out) >= limit:
            break
    return out


@dataclass(frozen=True)
class DroppedQuestion:
    question: str
    reason: DropReason
    chunk_index: int
    detail: str = ""


@dataclass(frozen=True)
class GenerationResult:
    dataset: GoldenDataset
    dropped: tuple[DroppedQuestion, ...]
    n_chunks: int
    completions: tuple[Completion, ...]

    @property
    def calls(self) -> int:
        return sum(1 for c in self.completions if not c.cached)


def select_chunks(chunks: Sequence[Chunk | str], *, max_chunks: int | None, min_chars: int = 200) -> list[tuple[int, str]]:
    """(index, text) of usable chunks; with ``max_chunks``, evenly spaced over the corpus for diversity."""
    usable = [(i, c.text if isinstance(c, Chunk) else c) for i, c in enumerate(chunks)]
    usable = [(i, t) for i, t in usable if len(t.strip()) >= min_chars]
    if not usable:
        raise DataError(f"no chunk has at least {min_chars} characters of text to generate questions from")
    if max_chunks is None or max_chunks >= len(usable):
        return usable
    if max_chunks <= 0:
        raise ConfigError(f"max_chunks must be positive, got {max_chunks}")
    step = len(usable) / max_chunks
    return [usable[int(k * step)] for k in range(max_chunks)]


@dataclass(frozen=True)
class _Asker:
    """The two calls of generation, at temperature 0: a chunk's questions, and a question's answer."""

    llm: ChatClient
    questions_per_chunk: int
    question_template: str
    answer_template: str
    #: The question query with its number of questions filled in.
    query: str
    question_max_tokens: int
    answer_max_tokens: int

    def fill(self, tmpl: str, context: str, q: str) -> str:
        # str.replace, not str.format: chunk text may contain braces.
        return (
            tmpl.replace("{num_questions_per_chunk}", str(self.questions_per_chunk))
            .replace("{query_str}", q)
            .replace("{context_str}", context)
        )

    def questions(self, item: tuple[int, str], bar: ProgressBar) -> tuple[int, str, Completion]:
        idx, text = item
        # Small models often write more questions than asked: stop at the next number instead of paying for it.
        stops = (f"\n{self.questions_per_chunk + 1}.", f"\n{self.questions_per_chunk + 1})")
        c = self.llm.complete(
            [Message("user", self.fill(self.question_template, text, self.query))],
            temperature=0.0,
            max_tokens=self.question_max_tokens,
            stop=stops,
        )
        bar.advance()
        return idx, text, c

    def answer(self, item: tuple[int, str, str], bar: ProgressBar) -> Completion:
        _, text, question = item
        c = self.llm.complete(
            [Message("user", self.fill(self.answer_template, text, question))], temperature=0.0,
            max_tokens=self.answer_max_tokens,
        )
        bar.advance()
        return c


@dataclass(frozen=True)
class _Asked:
    """What the calls returned: every question call's completion (chunk order), the questions kept
    (chunk index, chunk text, question) with their answers, and the questions dropped on the way."""

    question_completions: tuple[Completion, ...]
    kept: tuple[tuple[int, str, str], ...]
    answers: tuple[Completion, ...]
    dropped: tuple[DroppedQuestion, ...]


def _check_generation(questions_per_chunk: int, question_template: str, answer_template: str) -> None:
    if questions_per_chunk <= 0:
        raise ConfigError(f"questions_per_chunk must be positive, got {questions_per_chunk}")
    for name, tmpl in (("question_template", question_template), ("answer_template", answer_template)):
        for var in ("{context_str}", "{query_str}"):
            if var not in tmpl:
                raise ConfigError(f"{name} must contain {var}")


def _new_questions(c: Completion, idx: int, text: str, *, limit: int,
                   seen: NearDuplicates) -> tuple[list[tuple[int, str, str]], list[DroppedQuestion]]:
    """A chunk's questions from its reply: (those kept, those dropped: none parsed, or a duplicate of
    one kept before, which ``seen`` then holds)."""
    dropped: list[DroppedQuestion] = []
    parsed = parse_questions(c.text, limit=limit)
    if not parsed:
        dropped.append(DroppedQuestion(c.text.strip()[:200], "empty", idx, "no question in the reply"))
    new: list[tuple[int, str, str]] = []
    for q in parsed:
        why = seen.match(q)
        if why is not None:
            dropped.append(DroppedQuestion(q, why, idx))
        else:
            new.append((idx, text, q))
            seen.add(q)
    return new, dropped


def _ask(selected: Sequence[tuple[int, str]], asker: _Asker, *, seen: NearDuplicates, n_workers: int,
         progress: bool) -> _Asked:
    """Every chunk's questions, the duplicates dropped, and every kept question's answer."""
    completions: list[Completion] = []
    dropped: list[DroppedQuestion] = []
    kept: list[tuple[int, str, str]] = []  # (chunk index, chunk text, question)
    answer_calls: list[Future[Completion]] = []
    # The bar's total is planned before the first call: a question call per chunk and an answer call
    # per question asked; a chunk that gives fewer new questions skips the answer calls it will not need.
    planned = len(selected) * (1 + asker.questions_per_chunk)
    with (
        progress_bar("generating golden examples", total=planned, enabled=progress) as bar,
        ThreadPoolExecutor(max_workers=n_workers) as pool,
    ):
        # Chunk by chunk, in order (the duplicate check compares with earlier chunks' questions): a
        # chunk's answers are asked as soon as its questions are in, before the next chunk's question
        # call is queued. Both prompts start with the chunk, so an in-process model reuses its KV
        # instead of prefilling the chunk again; n_workers question calls stay in flight for an endpoint.
        question_calls = [pool.submit(asker.questions, item, bar) for item in selected[:n_workers]]
        for i in range(len(selected)):
            idx, text, c = question_calls[i].result()
            completions.append(c)
            new, why = _new_questions(c, idx, text, limit=asker.questions_per_chunk, seen=seen)
            dropped.extend(why)
            bar.skip(asker.questions_per_chunk - len(new))
            kept.extend(new)
            answer_calls.extend(pool.submit(asker.answer, item, bar) for item in new)
            if i + n_workers < len(selected):
                question_calls.append(pool.submit(asker.questions, selected[i + n_workers], bar))
        answers = [call.result() for call in answer_calls]
    return _Asked(question_completions=tuple(completions), kept=tuple(kept), answers=tuple(answers),
                  dropped=tuple(dropped))


def _examples(asked: _Asked, *, model: str) -> tuple[list[Example], list[DroppedQuestion]]:
    """The golden examples of the kept questions whose answer is usable; (examples, questions dropped
    for an empty answer or one saying the context lacks it)."""
    examples: list[Example] = []
    dropped: list[DroppedQuestion] = []
    by = {"model_name": model, "type": "ai"}
    for (idx, text, question), c in zip(asked.kept, asked.answers, strict=True):
        answer = c.text.strip()
        if not answer:
            dropped.append(DroppedQuestion(question, "empty-answer", idx))
        elif says_not_in_context(answer):
            dropped.append(DroppedQuestion(question, "not-in-context", idx, answer[:200]))
        else:
            examples.append(
                Example(
                    query=question,
                    reference_answer=answer,
                    reference_contexts=(text,),
                    query_by=by,
                    reference_answer_by=by,
                )
            )
    return examples, dropped


def generate_examples(
    *,
    chunks: Sequence[Chunk | str],
    llm: ChatClient,
    questions_per_chunk: int = 2,
    max_chunks: int | None = None,
    question_query: str = DEFAULT_QUESTION_QUERY,
    question_template: str = DEFAULT_QUESTION_TEMPLATE,
    answer_template: str = DEFAULT_ANSWER_TEMPLATE,
    question_max_tokens: int | None = None,
    answer_max_tokens: int = 160,
    min_chunk_chars: int = 200,
    jaccard_threshold: float = 0.8,
    ratio_threshold: float = 0.9,
    workers: int | None = None,
    progress: bool = True,
    exclude: Sequence[str] = (),
) -> GenerationResult:
    """Generate golden examples; see :func:`generate_dataset`. Also returns what was dropped and why.
    ``exclude``: questions asked before (a dataset's, for its pool): one that duplicates any is dropped."""
    _check_generation(questions_per_chunk, question_template, answer_template)
    selected = select_chunks(chunks, max_chunks=max_chunks, min_chars=min_chunk_chars)
    asker = _Asker(
        llm=llm, questions_per_chunk=questions_per_chunk, question_template=question_template,
        answer_template=answer_template,
        query=question_query.replace("{num_questions_per_chunk}", str(questions_per_chunk)),
        question_max_tokens=question_max_tokens or 40 * questions_per_chunk + 16, answer_max_tokens=answer_max_tokens,
    )
    n_workers = max(1, min(workers or llm.llm.max_concurrency, llm.llm.max_concurrency))
    seen = NearDuplicates(jaccard=jaccard_threshold, ratio=ratio_threshold)
    for q in exclude:
        seen.add(q)
    asked = _ask(selected, asker, seen=seen, n_workers=n_workers, progress=progress)
    examples, unanswered = _examples(asked, model=llm.model)
    return GenerationResult(
        dataset=GoldenDataset(tuple(examples)), dropped=(*asked.dropped, *unanswered), n_chunks=len(selected),
        completions=(*asked.question_completions, *asked.answers),
    )


def generate_dataset(
    *,
    chunks: Sequence[Chunk | str],
    llm: ChatClient,
    questions_per_chunk: int = 2,
    max_chunks: int | None = None,
    question_query: str = DEFAULT_QUESTION_QUERY,
    answer_max_tokens: int = 160,
    workers: int | None = None,
    progress: bool = True,
) -> GoldenDataset:
    """A golden dataset from chunks: ``questions_per_chunk`` questions each, answered from the chunk.

    ``query_by`` / ``reference_answer_by`` name the generating model; the chunk is the single
    reference context. Use :func:`generate_examples` for the list of dropped questions.
    """
    return generate_examples(
        chunks=chunks,
        llm=llm,
        questions_per_chunk=questions_per_chunk,
        max_chunks=max_chunks,
        question_query=question_query,
        answer_max_tokens=answer_max_tokens,
        workers=workers,
        progress=progress,
    ).dataset


__all__ = [
    "DEFAULT_ANSWER_TEMPLATE",
    "DEFAULT_QUESTION_QUERY",
    "DEFAULT_QUESTION_TEMPLATE",
    "DroppedQuestion",
    "GenerationResult",
    "generate_dataset",
    "generate_examples",
    "is_near_duplicate",
    "parse_questions",
    "says_not_in_context",
    "select_chunks",
]
