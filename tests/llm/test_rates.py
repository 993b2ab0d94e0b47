"""Each model's measured speed on this machine (opro.llm.rates): recorded by the client factory of a
command, read back by the plan."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from opro.llm import Message
from opro.llm.factory import ClientFactory
from opro.llm.pool import ModelPool, ModelSpec
from opro.llm.rates import MIN_CALLS, MeasuredRate, load_rates, record_rates
from opro.llm.scripted import ScriptedLLM


def _usage(calls: int, seconds: float) -> dict[str, float]:
    return {"calls": calls, "prompt_tokens": 100 * calls, "completion_tokens": 10 * calls, "wall_s": seconds}


def test_a_record_keeps_each_models_latest_command_of_enough_calls(tmp_path: Path) -> None:
    path = tmp_path / "rates.json"
    assert load_rates(path) == {}  # nothing measured yet
    record_rates({"llamacpp:a": _usage(4, 8.0), "llamacpp:b": _usage(MIN_CALLS - 1, 1.0)}, path=path,
                 now=datetime(2026, 1, 2, tzinfo=UTC))
    first = load_rates(path)
    assert set(first) == {"llamacpp:a"} and first["llamacpp:a"].measured.startswith("2026-01-02")
    record_rates({"llamacpp:a": _usage(3, 3.0), "openai:c": _usage(5, 5.0)}, path=path)
    later = load_rates(path)
    assert later["llamacpp:a"].seconds == 3.0 and later["llamacpp:a"].calls == 3 and later["openai:c"].latency == 1.0
    path.write_text("not json")
    assert load_rates(path) == {}  # a broken record is no record: the plan's defaults apply


def test_the_rate_scales_the_defaults_shape_by_the_measured_speed() -> None:
    rate = MeasuredRate(key="llamacpp:m", calls=10, prompt_tokens=9000, completion_tokens=900, seconds=400.0,
                        measured="2026-01-01T00:00:00+00:00")
    # The defaults (90 prompt and 9 completion tokens per second) give 100 + 100 = 200 s: twice as slow here.
    assert rate.factor(prefill=90.0, decode=9.0) == pytest.approx(2.0)
    assert rate.seconds_per_call(90.0, 9.0, prefill=90.0, decode=9.0) == pytest.approx(4.0)


def test_the_factory_records_the_models_it_served_and_leaves_scripted_ones_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fault_server import FaultServer

    path = tmp_path / "rates.json"
    monkeypatch.setenv("RATES_TEST_KEY", "sk-rates-test-0123456789")
    with FaultServer(key="sk-rates-test-0123456789", latency_s=0.02) as server:
        factory = ClientFactory(pool=ModelPool(scripted={"task": ScriptedLLM(default="yes", model="task")}), rates=path)
        judge = factory.client(ModelSpec(backend="openai", model="judge-model", base_url=server.base_url,
                                         api_key_env="RATES_TEST_KEY"), role="judge")
        task = factory.client(ModelSpec(backend="scripted", model="task"), role="task")
        for i in range(4):
            judge.complete([Message("user", f"Question {i}? Score it.")], max_tokens=8)
            task.complete([Message("user", f"Question {i}?")])
        factory.close()
    kept = load_rates(path)
    assert set(kept) == {"openai:judge-model"}
    assert kept["openai:judge-model"].calls == 4 and kept["openai:judge-model"].seconds >= 4 * 0.02
