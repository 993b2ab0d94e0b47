"""The shared call budget: charged per call (cache hits too), refused past the limit, swappable."""

from __future__ import annotations

from pathlib import Path

import pytest

from opro.errors import OproError
from opro.llm import UsageLedger
from opro.llm.budget import BudgetedChatClient, BudgetExhaustedError, CallBudget, raised_by_budget
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM


def test_the_budget_refuses_the_call_past_the_limit_and_counts_cache_hits(tmp_path: Path) -> None:
    llm = ScriptedLLM(default="ok")
    ledger = UsageLedger()
    budget = CallBudget(3)
    client = BudgetedChatClient(llm, role="task", cache=CallCache(tmp_path / "c.sqlite"), usage=ledger, budget=budget)
    client.complete("a")
    client.complete("a")  # answered by the cache, still charged: a warm rerun stops at the same point
    client.complete("b")
    assert budget.used == 3 and not budget.exhausted
    with pytest.raises(BudgetExhaustedError, match="budget of 3"):
        client.complete("c")
    assert budget.exhausted and budget.by_role() == {"task": 3}
    assert len(llm.calls) == 2  # the refused call never reached the model
    usage = ledger.snapshot()["task"]
    assert (usage.calls, usage.cache_hits) == (2, 1)


def test_roles_share_one_budget_and_it_can_be_swapped_or_removed() -> None:
    budget = CallBudget(2)
    task = BudgetedChatClient(ScriptedLLM(default="a"), role="task", budget=budget)
    judge = BudgetedChatClient(ScriptedLLM(default="5"), role="judge", budget=budget)
    task.complete("q")
    judge.complete("j")
    with pytest.raises(BudgetExhaustedError):
        task.complete("q2")
    assert budget.by_role() == {"task": 1, "judge": 1}
    task.budget = None
    task.complete("q3")  # no budget: unlimited
    task.budget = CallBudget(1)
    task.complete("q4")
    with pytest.raises(BudgetExhaustedError):
        task.complete("q5")


def test_a_wrapped_budget_error_is_recognized() -> None:
    try:
        try:
            raise BudgetExhaustedError("spent")
        except BudgetExhaustedError as inner:
            raise RuntimeError("a library re-wrapped it") from inner
    except RuntimeError as outer:
        assert raised_by_budget(outer)
    assert not raised_by_budget(RuntimeError("other"))
    with pytest.raises(OproError, match="at least one call"):
        CallBudget(0)
