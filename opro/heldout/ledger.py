"""The decision ledger: every verdict opro has drawn from a set of questions, kept by the questions.

A validation decision (does the finalist beat the initial instruction?) and a promotion attempt
(``compare --promote``) each spend an error budget on their questions. Once a verdict on those
questions has been seen, deciding again on them under another design (alpha, looks, finalists,
``min_coverage``, ...) or other settings (judge, task model, template, retrieval: the study's
fingerprint) is a fresh chance at a false claim. Output folders, study stores and copies of a dataset
come and go, so the ledger is the user's: one file beside the call cache, which every run of the same
user reads whatever folder the dataset sits in (``Experiment`` chooses it; see docs/configuration.md),
with a second copy beside the dataset that travels with it. Decisions are matched by the content
hashes of their questions, never by where the dataset lies.

One JSON record a line, appended under a file lock. A decision is identified by its ``key`` (its
design and fingerprint): the same key is the same decision, which a rerun resumes (its later
records, with the verdict, supersede the earlier ones). Questions are kept as short hashes of the
normalized question, so overlap between any two decisions can be measured.

Deleting or editing a ledger file stays possible. Where it is seen (a study that recorded a decision
whose record is in no copy of the ledger: :meth:`DecisionLedger.restore`), the lost record is written
back and every decision made since on its questions is recorded as :data:`RE_DECIDED`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

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
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        return cls(scope=str(data["scope"]), key=str(data["key"]), questions=tuple(data.get("questions") or ()),
                   design=dict(data.get("design") or {}), fingerprint=dict(data.get("fingerprint") or {}),
                   verdict=data.get("verdict"), where=str(data.get("where", "")), at=str(data.get("at", "")),
                   re_decided=bool(data.get("re_decided", False)))


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
    def of_user(cls, folder: Path, *, dataset: Path | None, origin: str) -> DecisionLedger:
        """The user's ledger in ``folder`` (beside the call cache), with a copy beside ``dataset`` (in the
        file's folder, or the dataset folder) that is read and written too; one in a folder opro cannot
        write, or read-only by its mode, is only read."""
        copies: list[Path] = []
        also_read: list[Path] = []
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
        if not path.is_file():
            return []
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(Decision.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                # A line torn by a crash mid-append holds no finished record; it is said, not fatal.
                logger.warning("%s: line %d is not a decision record and is ignored (%s)", path, n, exc)
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

    def restore(self, recorded: Iterable[tuple[str, Decision]]) -> list[str]:
        """Write back the decisions a study recorded (``(where, decision)``) that no file of the ledger
        holds (it was deleted or edited), and record as :data:`RE_DECIDED` every decision the ledger
        holds that was made later on too many of a restored one's questions (it was made while the
        ledger had lost that verdict). Returns what was done, one line each (empty: nothing was lost)."""
        said: list[str] = []
        with self._lock():
            known = self.decisions()
            keys = {(d.scope, d.key) for d in known}
            lost = [(w, d) for w, d in recorded
                    if (d.scope, d.key) not in keys and d.verdict is not None and not d.re_decided]
            for where, d in lost:
                self._append_everywhere(d)
                said.append(f"the decision ledger ({self.path}) lacked the decision recorded in {where} ({d.verdict}): "
                            "it was deleted or edited (or the decision was made with another ledger); written back")
                for later in known:
                    if (later.scope != d.scope or later.key == d.key or later.re_decided or later.at <= d.at
                            or later.seen_share(d)[1] <= MAX_SEEN_SHARE):
                        continue
                    self._append_everywhere(here=False, decision=replace(later, re_decided=True, verdict=(
                        f"{RE_DECIDED} (made while the ledger had lost the verdict recorded in {where} at {d.at}): "
                        f"{later.verdict or 'not finished'}")))
                    said.append(f"the decision made at {later.at} on the same questions ({later.where}) is now recorded "
                                f"as {RE_DECIDED}: it claims nothing and refuses nothing")
        for line in said:
            logger.warning("%s", line)
        return said

    def _append_everywhere(self, decision: Decision, *, here: bool = True) -> None:
        """Append to the user's file and to each copy (a copy that cannot be written is said, and
        skipped: the user's file holds the record)."""
        self._append(self.path, decision, here=here)
        for copy in self.copies:
            try:
                with self._lock(copy):
                    self._append(copy, decision, here=here)
            except OSError as exc:
                logger.warning("the copy of the decision ledger at %s cannot be written (%s): the record is kept in %s",
                               copy, exc, self.path)

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


def sha(text: str) -> str:
    """The 16-hex-digit sha256 of ``text``: the digest that keys decisions, designs and question sets."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def short_hashes(hashes: Sequence[str]) -> tuple[str, ...]:
    """Question hashes cut to 16 hex digits (64 bits: no collision among any dataset's questions)."""
    return tuple(h[:16] for h in hashes)


__all__ = ["LEDGER_FILE", "MAX_SEEN_SHARE", "RE_DECIDED", "Decision", "DecisionLedger", "conflict", "latest", "now",
           "sha", "short_hashes"]
