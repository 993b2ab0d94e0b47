"""The design of a validation decision, typed: what the decision is resumed under, and refused under another.

The study keeps it (``validation_design``, and with its looks in ``validation_history``) in the form
:meth:`ValidationDesign.to_json` gives, and its ``key`` hashes that form. So the form is the record's
and never changes: an entry that did not exist when a decision was made is absent from its design (not
null), and the values are kept as they were given (not converted), so that a study or ledger written
before this type existed reads back, and keys again, as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from opro.hashing import sha
from opro.stats.sequential import Look

#: ``min_coverage`` at its default is left out of a design's key, so decisions recorded before it was
#: part of the design (at that default) are resumed, not refused.
_MIN_COVERAGE_UNKEYED = 0.9


@dataclass(frozen=True)
class ValidationDesign:
    """What a validation decision was planned as: its test, finalists, questions and coverage rule."""

    alpha: float
    #: Planned looks of the confirmation (the extension's included).
    looks: int
    futility: bool
    selection_questions: int
    #: The finalists' instructions, in search rank (cost order with the cost objective).
    finalists: tuple[str, ...]
    initial: str
    #: Questions of the validation split (selection and confirmation).
    n_questions: int
    procedure: str
    #: :func:`opro.search.study.questions_key` of the validation split's questions.
    questions: str
    #: None only in a design recorded before ``min_coverage`` was part of it (at its default then).
    min_coverage: float | None
    # The optional entries: None here, absent from the stored design, as in designs made before they
    # existed (so those keep their key).
    #: 1 with futility (earlier versions stopped from look 2: a decision is never resumed under another rule).
    futility_from_look: int | None = None
    #: Extension questions planned (in no split) and their :func:`~opro.search.study.questions_key`.
    extension: int | None = None
    extension_questions: str | None = None
    #: The objective's name (with its ``margin``) except under quality (None: keys recorded before objectives).
    objective: str | None = None
    margin: float | None = None
    #: Made on questions an earlier verdict saw (``seen_validation = "label"``): its own key, so that
    #: neither this decision nor an unlabelled one of the same design ever resumes the other.
    re_decided: bool = False
    #: :meth:`keyed`'s hash ("" until keyed); a stored design's as it was stored.
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        """The stored form, its entries in the order they have always been written."""
        out: dict[str, Any] = {
            "alpha": self.alpha, "looks": self.looks, "futility": self.futility,
            "selection_questions": self.selection_questions, "finalists": list(self.finalists),
            "initial": self.initial, "n_questions": self.n_questions, "procedure": self.procedure,
            "questions": self.questions,
        }
        optional = {"futility_from_look": self.futility_from_look, "extension": self.extension,
                    "extension_questions": self.extension_questions, "objective": self.objective,
                    "margin": self.margin, "min_coverage": self.min_coverage}
        out.update((k, v) for k, v in optional.items() if v is not None)
        out["key"] = self.key
        if self.re_decided:
            out["re_decided"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationDesign:
        """A stored design, of any version: the entries it lacks are None, its key is kept as stored."""
        return cls(
            alpha=data["alpha"], looks=data["looks"], futility=data["futility"],
            selection_questions=data["selection_questions"], finalists=tuple(data["finalists"]),
            initial=data["initial"], n_questions=data["n_questions"], procedure=data["procedure"],
            questions=data["questions"], min_coverage=data.get("min_coverage"),
            futility_from_look=data.get("futility_from_look"), extension=data.get("extension"),
            extension_questions=data.get("extension_questions"), objective=data.get("objective"),
            margin=data.get("margin"), re_decided=bool(data.get("re_decided", False)), key=data["key"],
        )

    def keyed(self) -> ValidationDesign:
        """This design with its ``key``: a hash of every stored entry but ``min_coverage`` at its old default."""
        kept = sorted((k, repr(v)) for k, v in self.to_json().items()
                      if k != "key" and not (k == "min_coverage" and v == _MIN_COVERAGE_UNKEYED))
        return replace(self, key=sha(repr(kept)))

    def summary_json(self) -> dict[str, Any]:
        """The form summary.json shows: the stored one without the instructions (the finalists are
        listed beside it, and the initial instruction is the summary's own)."""
        return {k: v for k, v in self.to_json().items() if k not in ("finalists", "initial")}


@dataclass(frozen=True)
class EarlierDecision:
    """An earlier decision of a study, on other validation questions: its design and its looks."""

    design: ValidationDesign
    looks: tuple[Look, ...]

    def to_json(self) -> dict[str, Any]:
        return {"design": self.design.to_json(), "looks": [x.as_dict() for x in self.looks]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EarlierDecision:
        return cls(design=ValidationDesign.from_json(data["design"]),
                   looks=tuple(Look.from_dict(x) for x in data.get("looks", [])))


__all__ = ["EarlierDecision", "ValidationDesign"]
