"""The keyword world: a search on scripted models whose scores a test can work out by hand.

An instruction scores one point per keyword it holds (:data:`KEYWORDS`); the task model answers with
the instruction itself (:class:`EchoProgram`), the judge counts the keywords (:class:`KeywordJudge`) and
the optimizer proposes from a fixed list by its seed. :func:`keyword_optimizer` builds a whole search
there, over a SQLite study, recording into a run directory: what the contract suites run a recorder or a
proposer against, and what a plug-in's own tests can reuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.config import OptimizerSection
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger
from opro.llm.cache import CallCache
from opro.llm.scripted import Responder, ScriptedLLM
from opro.paths import RunDir
from opro.tracking.rundir_recorder import RunDirRecorder

if TYPE_CHECKING:
    from opro.search import Search, SearchStudy


@dataclass(frozen=True)
class TextTemplate:
    """A QA template that is its instruction (what :class:`EchoProgram` answers with)."""

    instruction: str

    @property
    def template_text(self) -> str:
        return f"{self.instruction}\n{{context_str}}\nQuery: {{query_str}}\nAnswer: "

    def with_instruction(self, instruction: str) -> TextTemplate:
        return TextTemplate(instruction)

    def __str__(self) -> str:
        return self.instruction


#: An instruction scores one point per keyword it holds; candidates without one score 1 everywhere.
KEYWORDS = ("context", "precise", "cite", "brief")


@dataclass(frozen=True)
class Ex:
    query: str
    reference_answer: str


class EchoProgram:
    """Answers with the instruction itself, through a real ChatClient (cache, usage)."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def answer(self, query: str, *, template: Any) -> Any:
        return self.client.complete(f"{template}\nQuery: {query}")


@dataclass(frozen=True)
class Verdict:
    score: float | None
    invalid: bool


class KeywordJudge:
    """Scores an answer by how many keywords its instruction has, through a real ChatClient."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> Verdict:
        reply = self.client.complete(f"Grade.\nAnswer: {answer}\nReference: {reference}").text
        score = float(reply) if reply.strip() else None
        return Verdict(score, score is None)


def keyword_task_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return messages[-1].content.split("\nQuery:")[0]


def keyword_judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    text = messages[-1].content
    answer = text.split("Answer: ", 1)[1].split("\nReference:")[0].lower()
    hits = sum(1 for k in KEYWORDS if k in answer)
    found = re.search(r"ref(\d+)", text)
    qnum = int(found.group(1)) if found else 0
    # Candidates with no keyword do badly on every question; others gain one point per keyword.
    return str(min(5, 1 + hits + (qnum % 2 if hits else 0)))


def keyword_optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    words = ["Use the context", "Be precise", "Cite sources", "Be brief", "Answer well", "Try hard"]
    i = (options.seed or 0) % 1000
    picks = [words[(i + j) % len(words)] for j in range(1 + i % 3)]
    return "<INS>" + ". ".join(picks) + f" (v{i}).</INS>"


def keyword_examples(n: int) -> list[Ex]:
    return [Ex(f"question {i}?", f"ref{i}") for i in range(n)]


@dataclass
class Rig:
    """The scripted models behind a keyword optimizer, and its usage ledger."""

    task: ScriptedLLM
    judge: ScriptedLLM
    optimizer: ScriptedLLM
    usage: UsageLedger


class SearchRig:
    """Builds a :class:`opro.search.Search` from the collaborators a test gives, over a SQLite study,
    and runs it on a program given per run (as ``Experiment`` does for a config)."""

    def __init__(self, *, optimizer_llm: ChatClient, judge: Any, settings: OptimizerSection, storage: str,
                 study_name: str, usage: UsageLedger, recorders: Sequence[Any] = (), seed: int = 0,
                 template: Any = None, fingerprint: dict[str, str] | None = None, ledger: Any = None) -> None:
        self.optimizer_llm, self.judge, self.settings = optimizer_llm, judge, settings
        self.storage, self.study_name, self.usage, self.seed = storage, study_name, usage, seed
        self.recorders = tuple(recorders)
        self.template = template or TextTemplate("")
        self.fingerprint = fingerprint or {}
        self.ledger = ledger
        self.worker_index, self.num_workers, self.worker_timeout_s = 0, 1, 3600.0
        self.task_workers, self.judge_workers = 1, None
        self.last: Search | None = None

    def study(self) -> SearchStudy:
        from opro.experiment.settings import pruner_settings
        from opro.search import SearchStudy, make_pruner, open_storage

        return SearchStudy.open(open_storage(self.storage), name=self.study_name, pruner=make_pruner(pruner_settings(self.settings)))

    def _study(self) -> Any:
        return self.study().optuna

    def search(self, program: Any) -> Search:
        from opro.experiment.settings import proposer_settings, search_settings
        from opro.search import CandidateScorer, Search, WorkerPlan, make_proposer

        study = self.study()
        study.check_fingerprint(self.fingerprint)
        scorer = CandidateScorer(program=program, judge=self.judge, template=self.template,
                                 task_slots=self.task_workers, judge_slots=self.judge_workers)
        proposer = make_proposer(settings=proposer_settings(self.settings), llm=self.optimizer_llm,
                                 template_text=self.template.with_instruction("<INS>").template_text, seed=self.seed)
        self.last = Search(proposer, scorer, study, search_settings(self.settings), usage=self.usage,
                           workers=WorkerPlan(index=self.worker_index, count=self.num_workers,
                                              timeout_s=self.worker_timeout_s),
                           recorders=self.recorders, seed=self.seed, progress=False, ledger=self.ledger)
        return self.last

    def coordinator(self, *, token: str) -> tuple[Any, Callable[[str, Sequence[int]], list[str]]]:
        """This worker's coordinator holding the lease ``token``, and its proposer's sampler."""
        search = self.search(None)
        search.coordinator.token = token
        return search.coordinator, search.proposer.ask

    def optimize(self, *, program: Any, optimization_set: Sequence[Any], exemplar_set: Sequence[Any] = (),
                 validation_set: Sequence[Any] = (), extension_set: Sequence[Any] = (),
                 initial_instructions: Sequence[str], pooled: int = 0) -> Any:
        return self.search(program).run(initial=initial_instructions, optimization_set=optimization_set,
                                        exemplar_set=exemplar_set, validation_set=validation_set,
                                        extension_set=extension_set, pooled=pooled)


def keyword_optimizer(
    tmp_path: Path, *, cache: CallCache | None = None, judge_reply: Responder = keyword_judge_reply, **settings: object
) -> tuple[SearchRig, Rig, EchoProgram]:
    """A search in the keyword world, recording into ``tmp_path/out``, its study in
    ``tmp_path/optuna.db`` (study "test"). ``judge_reply``: the judge model (a slower one, say);
    ``settings`` override the [optimizer] section."""
    usage = UsageLedger()
    task = ScriptedLLM(default=keyword_task_reply)
    judge_llm = ScriptedLLM(default=judge_reply)
    opt_llm = ScriptedLLM(default=keyword_optimizer_reply)
    program = EchoProgram(ChatClient(task, role="task", cache=cache, usage=usage))
    judge = KeywordJudge(ChatClient(judge_llm, role="judge", cache=cache, usage=usage))
    # The search itself (no validation stage: tests/search/test_selection.py covers that).
    base: dict[str, Any] = {"steps": 3, "candidates_per_step": 3, "minibatch_size": 2, "pruner": "none", "finalists": 0}
    base.update(settings)
    opt = SearchRig(
        optimizer_llm=ChatClient(opt_llm, role="optimizer", cache=cache, usage=usage),
        judge=judge,
        settings=OptimizerSection(**base),
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        study_name="test",
        usage=usage,
        recorders=[RunDirRecorder(RunDir(tmp_path / "out"))],
    )
    return opt, Rig(task, judge_llm, opt_llm, usage), program


def history_of(result: Any) -> list[tuple[object, ...]]:
    """What must not depend on workers or timing: every candidate's step, instruction, score, status,
    scores and cost per answer (a split candidate's parts bring their task calls' usage with them)."""
    return [(r.step, r.instruction, r.score, r.status, r.scores, r.cost) for r in result.history]




__all__ = [
    "KEYWORDS",
    "EchoProgram",
    "Ex",
    "KeywordJudge",
    "Rig",
    "SearchRig",
    "TextTemplate",
    "Verdict",
    "history_of",
    "keyword_examples",
    "keyword_judge_reply",
    "keyword_optimizer",
    "keyword_optimizer_reply",
    "keyword_task_reply",
]
