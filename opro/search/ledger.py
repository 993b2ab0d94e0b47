"""The decision ledger: every verdict opro has drawn from a set of questions, kept by the questions.

A validation decision (does the finalist beat the initial instruction?) and a promotion attempt
(``compare --promote``) each spend an error budget on their questions. Once a verdict on those
questions has been seen, deciding again on them under another design (alpha, looks, finalists,
``min_coverage``, ...) or other settings (judge, task model, template, retrieval: the study's
fingerprint) is a fresh chance at a false claim. Output folders, study stores, caches and copies of a
dataset come and go, so the ledger is the user's: one file in the user data folder
(:func:`opro.paths.data_dir`, never the cache folder users delete to free space), which every run of
the same user reads whatever folder the dataset sits in, with a second copy beside the dataset that
travels with it. Decisions are matched by the content hashes of their questions, never by where the
dataset lies.

One JSON record a line, appended under a file lock. A decision is identified by its ``key`` (its
design and fingerprint): the same key is the same decision, which a rerun resumes (its later
records, with the verdict, supersede the earlier ones). Questions are kept as short hashes of the
normalized question, so overlap between any two decisions can be measured.

Deleting or editing a ledger file stays possible. On every start the files (and the decisions a study
recorded) are reconciled (:meth:`DecisionLedger.reconcile`): what one holds and another lacks is
written back, and a decision made on the questions of an earlier one it could not see (the ledger that
held it was gone) is recorded as :data:`RE_DECIDED`. A line no crash can leave (bytes that are not
text, a record of the wrong shape) stops the run, named (:class:`~opro.errors.LedgerError`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from opro.errors import LedgerError
from opro.locking import waiting_lock

logger = logging.getLogger(__name__)

#: Share of a new decision's questions that may already have decided another verdict (under another
#: design or other settings) before the new decision is refused: a few shared questions move a
#: test little, a reshuffled pool (a new split seed: about 40% seen) moves it a lot.
MAX_SEEN_SHARE = 0.10

#: The ledger's file name, in the folder that holds the dataset.
LEDGER_FILE = "opro_decisions.jsonl"

#: The label of a decision made on questions whose verdict was seen (``[optimizer].seen_validation =
#: "label"``): an exploration that claims nothing, so it neither blocks nor unblocks later decisions.
RE_DECIDED = "re-decided after a seen verdict"


@dataclass(frozen=True)
class Decision:
    """One decision as the ledger keeps it."""

    #: What budget it spends: ``"validation"``, or ``"promotion <registry>@<alias>"``.
    scope: str
    #: Its identity: a digest of its design and fingerprint (the same key resumes the same decision).
    key: str
    #: Short hashes of its normalized questions (every question the decision may ask).
    questions: tuple[str, ...]
    #: The settings it was made under, as shown in a refusal (alpha, looks, min_coverage, ...; a
    #: future objective or margin is one more entry where it is set).
    design: Mapping[str, Any] = field(default_factory=dict)
    #: Digests of the fingerprint's entries (judge, task model, template, retrieval, split).
    fingerprint: Mapping[str, str] = field(default_factory=dict)
    #: None until decided (a decision begun and interrupted still holds its questions).
    verdict: str | None = None
    #: Where it was made (output folder, study), and when.
    where: str = ""
    at: str = ""
    #: Made on questions an earlier decision (another key) had decided: labelled :data:`RE_DECIDED`,
    #: never validated, and ignored by :func:`conflict`.
    re_decided: bool = False

    def seen_share(self, earlier: Decision) -> tuple[int, float]:
        """How many of this decision's questions ``earlier`` decided on, and their share."""
        mine = set(self.questions)
        if not mine:
            return 0, 0.0
        shared = len(mine & set(earlier.questions))
        return shared, shared / len(mine)

    def changes(self, earlier: Decision, *, partial: bool = False) -> list[str]:
        """What differs from ``earlier``: its design entries, then the fingerprint's. ``partial``: this
        design holds only some entries (a check before they are all known): compare only those."""
        keys = set(self.design) if partial else set(self.design) | set(earlier.design)
        out = [f"{k} {earlier.design.get(k)!r} -> {self.design.get(k)!r}"
               for k in sorted(keys) if self.design.get(k) != earlier.design.get(k)]
        fp = sorted(k for k in set(self.fingerprint) | set(earlier.fingerprint)
                    if self.fingerprint.get(k) != earlier.fingerprint.get(k))
        if fp:
            out.append("other settings (" + ", ".join(fp[:6]) + (", ..." if len(fp) > 6 else "") + ")")
        return out

    def to_json(self) -> dict[str, Any]:
        # re_decided only where set: the records of ordinary decisions stay as they were written.
        return {"scope": self.scope, "key": self.key, "questions": list(self.questions), "design": dict(self.design),
                "fingerprint": dict(self.fingerprint), "verdict": self.verdict, "where": self.where, "at": self.at,
                **({"re_decided": True} if self.re_decided else {})}

    @classmethod
    def from_json(cls, data: Any) -> Decision:
        """The record ``data`` (a parsed JSON line); ValueError naming what is wrong where it is no record."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a JSON {type(data).__name__}, not a record")
        for name, kind in (("scope", str), ("key", str), ("questions", list), ("design", dict),
                           ("fingerprint", dict), ("verdict", str), ("where", str), ("at", str), ("re_decided", bool)):
            value = data.get(name)
            if (value is None and name not in ("scope", "key")) or isinstance(value, kind):
                continue
            raise ValueError(f"{name!r} is {'missing' if value is None else type(value).__name__ + ' ' + repr(value)[:40]}"
                             f", not {kind.__name__}")
        if not all(isinstance(q, str) for q in data.get("questions") or ()):
            raise ValueError("'questions' holds something other than question hashes")
        return cls(scope=data["scope"], key=data["key"], questions=tuple(data.get("questions") or ()),
                   design=dict(data.get("design") or {}), fingerprint=dict(data.get("fingerprint") or {}),
                   verdict=data.get("verdict"), where=data.get("where") or "", at=data.get("at") or "",
                   re_decided=bool(data.get("re_decided", False)))

    @property
    def _rank(self) -> tuple[bool, bool]:
        """How far a decision's record has come: begun < decided < labelled re-decided (a later stage is
        never undone, so of two files' records of one decision the higher is the one to keep)."""
        return self.re_decided, self.verdict is not None


def conflict(new: Decision, earlier: Iterable[Decision]) -> Decision | None:
    """The earlier decision (of ``new``'s scope, under another key) that decided on more than
    :data:`MAX_SEEN_SHARE` of ``new``'s questions, the one sharing the most; None when there is none.
    A re-decided decision claims nothing: it is never refused and never refuses another."""
    if new.re_decided:
        return None
    worst: tuple[int, Decision] | None = None
    for d in earlier:
        if d.scope != new.scope or d.key == new.key or d.re_decided:
            continue
        shared, share = new.seen_share(d)
        if share > MAX_SEEN_SHARE and (worst is None or shared > worst[0]):
            worst = (shared, d)
    return None if worst is None else worst[1]


def latest(decisions: Iterable[Decision]) -> list[Decision]:
    """One record per (scope, key): the last one (it carries the verdict), in first-seen order."""
    out: dict[tuple[str, str], Decision] = {}
    for d in decisions:
        out[(d.scope, d.key)] = d
    return list(out.values())


def now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def _touches(decision: Decision, questions: Collection[str] | None) -> bool:
    """Whether ``decision`` was made on any of ``questions`` (None: every decision does): what a copy
    beside one dataset holds."""
    return questions is None or not set(decision.questions).isdisjoint(questions)


def _merged(records: Iterable[Decision]) -> list[Decision]:
    """One record per (scope, key) over several files' records: the last one with a verdict, else the
    first (a decision's verdict-less record is only ever its first, so it never supersedes a verdict)."""
    out: dict[tuple[str, str], Decision] = {}
    for d in records:
        had = out.get((d.scope, d.key))
        if had is None or d.verdict is not None or had.verdict is None:
            out[(d.scope, d.key)] = d
    return list(out.values())


class DecisionLedger:
    """The ledger file at ``path`` (the user's), and ``copies`` of it (beside the dataset) that are read
    and written with it, and ``also_read`` files that are only read (a read-only dataset folder's);
    ``origin`` names this process's output folder in its records."""

    def __init__(self, path: str | Path, *, origin: str = "", copies: Sequence[str | Path] = (),
                 also_read: Sequence[str | Path] = ()) -> None:
        self.path = Path(path)
        self.origin = origin
        self.copies = tuple(Path(c) for c in copies if Path(c) != self.path)
        self.also_read = tuple(Path(c) for c in also_read if Path(c) not in (self.path, *self.copies))

    @classmethod
    def of_user(cls, folder: Path, *, dataset: Path | None, origin: str,
                earlier_homes: Sequence[Path] = ()) -> DecisionLedger:
        """The user's ledger in ``folder`` (the user data folder), with a copy beside ``dataset`` (in the
        file's folder, or the dataset folder) that is read and written too; one in a folder opro cannot
        write, or read-only by its mode, is only read. ``earlier_homes``: folders an earlier opro kept the
        user's ledger in (beside the call cache), read so that :meth:`reconcile` brings their decisions home."""
        copies: list[Path] = []
        also_read: list[Path] = [h / LEDGER_FILE for h in earlier_homes]
        if dataset is not None:
            where = dataset if dataset.is_dir() else dataset.parent
            # Its mode, not only access: root may write anywhere, but a folder whose owner took its write
            # bits away (a shared, read-only data set) is not opro's to add files to.
            writable = os.access(where, os.W_OK) and bool(where.stat().st_mode & 0o222)
            (copies if writable else also_read).append(where / LEDGER_FILE)
        return cls(folder / LEDGER_FILE, origin=origin, copies=copies, also_read=also_read)

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file read, the user's first."""
        return (self.path, *self.copies, *self.also_read)

    def _lock(self, path: Path | None = None) -> Any:
        path = self.path if path is None else path
        return waiting_lock(path.with_name(path.name + ".lock"))

    @staticmethod
    def _read(path: Path) -> list[Decision]:
        """The records of ``path``. A line cut short by a crash mid-append (the start of a record) is said
        and skipped; a line no crash can leave raises :class:`LedgerError` naming the file and the line."""
        if not path.is_file():
            return []
        out = []
        for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _damaged(path, n, "bytes that are not UTF-8 text") from None
            try:
                data = json.loads(line)
            except ValueError as exc:
                if not line.lstrip().startswith("{"):
                    raise _damaged(path, n, "not a JSON record") from None
                logger.warning("%s: line %d is a record cut short (a crash while it was written) and is ignored (%s)",
                               path, n, exc)
                continue
            try:
                out.append(Decision.from_json(data))
            except ValueError as exc:
                raise _damaged(path, n, f"not a decision record: {exc}") from None
        return out

    def decisions(self) -> list[Decision]:
        """Every decision recorded in any of the files, its latest record each (the copies' first, so
        that a record the user's file holds wins where both differ)."""
        return _merged(d for path in (*self.files[1:], self.path) for d in self._read(path))

    def begin(self, decision: Decision) -> Decision | None:
        """Record ``decision`` unless an earlier one (another key) decided on too many of its questions:
        then that one is returned and nothing is written. The same key again (a resumed or repeated
        decision) is allowed and not written twice."""
        with self._lock():
            known = self.decisions()
            earlier = conflict(decision, known)
            if earlier is not None:
                return earlier
            if not any(d.scope == decision.scope and d.key == decision.key for d in known):
                self._append_everywhere(decision)
            return None

    def settle(self, decision: Decision) -> None:
        """Record ``decision``'s verdict (a later record of the same key supersedes the earlier ones);
        a rerun that resumed it to the same verdict writes nothing."""
        with self._lock():
            if any((d.scope, d.key, d.verdict) == (decision.scope, decision.key, decision.verdict)
                   for d in self.decisions()):
                return
            self._append_everywhere(decision)

    def reconcile(self, *, questions: Collection[str] | None = None,
                  recorded: Iterable[tuple[str, Decision]] = ()) -> list[str]:
        """Bring the files into agreement; run on every start. (1) The user's file gets every decision a
        copy, an earlier home or a study (``recorded``: ``(where, decision)``) holds and it lacks, (2) each
        writable copy the user's decisions on ``questions`` (hashes of its dataset's questions; None: all)
        that it lacks, and (3) a decision made on more than :data:`MAX_SEEN_SHARE` of an earlier one's
        questions (another key: it could not have been made had the earlier one been seen; the ledger that
        held it was gone) is recorded as :data:`RE_DECIDED`. Returns what was done, one line each, also
        logged as warnings (empty: the files agreed)."""
        said: list[str] = []
        with self._lock():
            held = {path: {(d.scope, d.key): d for d in _merged(self._read(path))} for path in self.files}
            mine = held[self.path]
            # A study's record is in this run's store: this output folder is where it was made.
            sources = [(str(path), d, False) for path in self.files[1:] for d in held[path].values()]
            sources += [(where, d, True) for where, d in recorded if d.verdict is not None and not d.re_decided]
            for where, d, here in sources:
                had = mine.get((d.scope, d.key))
                if had is not None and had._rank >= d._rank:
                    continue
                self._append(self.path, d, here=here)
                mine[(d.scope, d.key)] = d
                said.append(f"the decision ledger ({self.path}) lacked a decision that {where} holds "
                            f"({d.verdict or 'not finished'}; made in {d.where or 'an unnamed place'} at {d.at}): "
                            "written back")
            for copy in self.copies:
                behind = [d for k, d in mine.items()
                          if (k not in held[copy] or held[copy][k]._rank < d._rank)
                          and _touches(d, questions)]
                if behind and self._append_to_copy(copy, behind):
                    said.append(f"the copy of the decision ledger beside the dataset ({copy}) lacked "
                                f"{len(behind)} decision(s) on its questions that {self.path} holds: written")
            said += self._label_unseen(list(mine.values()), questions=questions)
        for line in said:
            logger.warning("%s", line)
        return said

    def _label_unseen(self, decisions: Sequence[Decision], *, questions: Collection[str] | None) -> list[str]:
        """Record as :data:`RE_DECIDED` each decision made later than an earlier one (another key, the
        same scope) on more than :data:`MAX_SEEN_SHARE` of its questions, both unlabelled: such a pair
        cannot come from one ledger (:meth:`begin` refuses the second), so the later one was made
        where the earlier was not seen."""
        said = []
        labelled: set[tuple[str, str]] = set()
        order = sorted((d for d in decisions if not d.re_decided), key=lambda d: (d.at, d.key))
        for i, later in enumerate(order):
            for earlier in order[:i]:
                if (earlier.scope != later.scope or earlier.at >= later.at or (earlier.scope, earlier.key) in labelled
                        or later.seen_share(earlier)[1] <= MAX_SEEN_SHARE):
                    continue
                labelled.add((later.scope, later.key))
                label = replace(later, re_decided=True, verdict=(
                    f"{RE_DECIDED} (made where the verdict made in {earlier.where or 'an unnamed place'} at "
                    f"{earlier.at} was not seen): {later.verdict or 'not finished'}"))
                self._append(self.path, label, here=False)
                for copy in self.copies:
                    if _touches(later, questions):
                        self._append_to_copy(copy, [label])
                said.append(f"the decision made at {later.at} on the same questions ({later.where}) is now recorded "
                            f"as {RE_DECIDED}: it claims nothing and refuses nothing (an earlier verdict, "
                            f"{earlier.verdict or 'not finished'}, made in {earlier.where or 'an unnamed place'} at {earlier.at}, "
                            "was not in the ledger it read)")
                break
        return said

    def _append_to_copy(self, copy: Path, decisions: Sequence[Decision], *, here: bool = False) -> bool:
        """Append ``decisions`` to ``copy``; False (said) where it cannot be written (the user's file holds
        the records)."""
        try:
            with self._lock(copy):
                for d in decisions:
                    self._append(copy, d, here=here)
        except OSError as exc:
            logger.warning("the copy of the decision ledger at %s cannot be written (%s): the record is kept in %s",
                           copy, exc, self.path)
            return False
        return True

    def _append_everywhere(self, decision: Decision, *, here: bool = True) -> None:
        """Append to the user's file and to each copy (a copy that cannot be written is said, and
        skipped: the user's file holds the record)."""
        self._append(self.path, decision, here=here)
        for copy in self.copies:
            self._append_to_copy(copy, [decision], here=here)

    def _append(self, path: Path, decision: Decision, *, here: bool = True) -> None:
        # ``here``: made by this process, whose output folder is named (a record of another's is kept as it is).
        where = ", ".join(x for x in (decision.where, self.origin if here else "") if x)
        record = {**decision.to_json(), "where": where, "at": decision.at or now()}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as fh:
            fh.seek(0, 2)
            torn = fh.tell() > 0 and (fh.seek(-1, 2), fh.read(1))[1] != b"\n"
            # After a torn last line, a new line: the record must not be glued to the fragment.
            fh.write(("\n" if torn else "").encode() + (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))


def _damaged(path: Path, line: int, why: str) -> LedgerError:
    return LedgerError(
        f"{path}: line {line} of the decision ledger is damaged ({why}); while it is, no decision on its "
        f"questions can be trusted to be refused or resumed: restore the file from a backup or delete line {line} "
        "(the decision it held is then forgotten, and its questions could decide again)")


__all__ = ["LEDGER_FILE", "MAX_SEEN_SHARE", "RE_DECIDED", "Decision", "DecisionLedger", "conflict", "latest", "now"]
