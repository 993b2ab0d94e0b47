"""A hard cap on the calls of some roles, shared by the clients that serve them.

Used to give several optimizers (opro's own, DSPy's) the same budget of task + judge calls: a
:class:`BudgetedChatClient` charges its :class:`CallBudget` before each call and raises
:class:`BudgetExhaustedError` once the budget is spent, so a search stops exactly at the budget
wherever in its loop it is, and the caller keeps its best-so-far.

A call is charged whether or not the call cache answers it: the budget counts the calls a method
*asks for*, so a rerun with a warm cache stops at the same point as the first run. The usage
ledger still tells real calls (``calls``) from cache hits (``cache_hits``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from opro.errors import OproError
from opro.llm import ChatClient, Completion, MessagesLike


class BudgetExhaustedError(OproError):
    """The call budget is spent: the search stops here and keeps its best-so-far."""


class CallBudget:
    """At most ``limit`` calls in total over the roles charged to it (thread-safe)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise OproError(f"a call budget must allow at least one call, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._used: dict[str, int] = {}
        self._refused = 0

    def charge(self, role: str) -> None:
        """Count one call of ``role``, or raise :class:`BudgetExhaustedError` if none is left."""
        with self._lock:
            if sum(self._used.values()) >= self.limit:
                self._refused += 1
                raise BudgetExhaustedError(
                    f"the budget of {self.limit} task + judge calls is spent ({self.by_role_text()})"
                )
            self._used[role] = self._used.get(role, 0) + 1

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._used.values())

    @property
    def exhausted(self) -> bool:
        """True once a call was refused (not merely when the last allowed call was made)."""
        with self._lock:
            return self._refused > 0

    def by_role(self) -> dict[str, int]:
        with self._lock:
            return dict(self._used)

    def by_role_text(self) -> str:
        return ", ".join(f"{role} {n}" for role, n in sorted(self._used.items())) or "no calls"


@dataclass
class BudgetedChatClient(ChatClient):
    """A :class:`ChatClient` whose calls are charged to ``budget`` first (no budget: unlimited).

    The budget may be swapped between searches (``client.budget = CallBudget(n)``), so one
    experiment's program and judge serve several budgeted searches in turn.
    """

    budget: CallBudget | None = field(default=None)

    def complete(self, messages: MessagesLike, **options: Any) -> Completion:
        if self.budget is not None:
            self.budget.charge(self.role)
        return super().complete(messages, **options)

    async def acomplete(self, messages: MessagesLike, **options: Any) -> Completion:
        if self.budget is not None:
            self.budget.charge(self.role)
        return await super().acomplete(messages, **options)


def raised_by_budget(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, a :class:`BudgetExhaustedError` (libraries re-wrap errors)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, BudgetExhaustedError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


__all__ = ["BudgetExhaustedError", "BudgetedChatClient", "CallBudget", "raised_by_budget"]
