"""ModelSpec validation and ModelPool sharing (no model is loaded here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import require_embedded

from opro.errors import ConfigError
from opro.llm.packs import EMBEDDED_MODELS, EMBEDDED_STRONG_MODEL, EMBEDDED_TASK_MODEL
from opro.llm.pool import ModelPool, ModelSpec, create_llm
from opro.llm.scripted import ScriptedLLM


def test_defaults_and_embedded_roles() -> None:
    assert ModelSpec().model == EMBEDDED_TASK_MODEL
    assert ModelSpec.embedded("task").model == EMBEDDED_TASK_MODEL
    for role in ("judge", "optimizer", "generator"):
        assert ModelSpec.embedded(role).model == EMBEDDED_STRONG_MODEL
    with pytest.raises(ConfigError, match="unknown role"):
        ModelSpec.embedded("critic")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "vllm"}, "not one of llamacpp, openai, scripted"),
        ({"model": " "}, "non-empty"),
        ({"base_url": "http://x/v1"}, "only used by backend 'openai'"),
        ({"backend": "openai", "model": "m", "base_url": "localhost:8000"}, "http://"),
        ({"api_key_env": "sk-abcdef123"}, "NAME of an environment variable"),
        ({"n_threads": 0}, "n_threads"),
        ({"n_ctx": 10}, "n_ctx"),
        ({"prefix_cache_mb": -1}, r"prefix_cache_mb must be an integer >= 0 \(0: off\), got -1"),
        ({"prefix_cache_mb": True}, "prefix_cache_mb must be an integer"),
        ({"draft_fill": -1}, r"draft_fill must be an integer >= 0 \(0 or 1: off\), got -1"),
        ({"draft_fill": 4.0}, "draft_fill must be an integer"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"json_schema": "no"}, "json_schema must be true or false"),
        ({"json_schema": False}, "only used by backend 'openai'"),
    ],
)
def test_spec_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelSpec(**kwargs)  # type: ignore[arg-type]


def test_api_key_value_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        ModelSpec(api_key_env="sk-abcdef123456")
    assert "abcdef123456" not in str(info.value)


def test_from_mapping_names_unknown_keys() -> None:
    spec = ModelSpec.from_mapping({"backend": "openai", "model": "gpt-4o-mini"}, where="models.judge")
    assert spec.backend == "openai"
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['temprature'\] in \[models.judge\]"):
        ModelSpec.from_mapping({"temprature": 0}, where="models.judge")
    with pytest.raises(ConfigError, match=r"\[models.task\]: n_ctx"):
        ModelSpec.from_mapping({"n_ctx": 1}, where="models.task")


def test_pool_scripted_and_recordings(tmp_path: Path) -> None:
    fake = ScriptedLLM(default="ok")
    pool = ModelPool(scripted={"fake": fake})
    assert pool.get(ModelSpec(backend="scripted", model="fake")) is fake
    rec = tmp_path / "rec.jsonl"
    ScriptedLLM.record(rec, {})
    llm = pool.get(ModelSpec(backend="scripted", model=str(rec)))
    assert llm is pool.get(ModelSpec(backend="scripted", model=str(rec)))
    with pytest.raises(ConfigError, match="neither a registered scripted backend"):
        pool.get(ModelSpec(backend="scripted", model="other"))


def test_pool_shares_openai_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", "k")
    with ModelPool() as pool:
        a = pool.get(ModelSpec(backend="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="OPRO_TEST_KEY"))
        b = pool.get(ModelSpec(backend="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="OPRO_TEST_KEY"))
        c = pool.get(ModelSpec(backend="openai", model="m2", base_url="http://127.0.0.1:9/v1", api_key_env="OPRO_TEST_KEY"))
        assert a is b and a is not c
        assert a.max_concurrency == 8
    assert pool.loaded() == []
    assert create_llm(ModelSpec(backend="openai", model="m", base_url="http://localhost:9/v1")).model == "m"


def test_pool_shares_one_llamacpp_model_between_roles() -> None:
    require_embedded(EMBEDDED_STRONG_MODEL)
    pack = EMBEDDED_MODELS[EMBEDDED_STRONG_MODEL]
    with ModelPool() as pool:
        judge = pool.get(ModelSpec.embedded("judge"))
        optimizer = pool.get(ModelSpec.embedded("optimizer"))
        by_path = pool.get(ModelSpec(backend="llamacpp", model=str(pack.target())))
        assert judge is optimizer is by_path
        assert pool.get(ModelSpec.embedded("judge", n_ctx=2048)) is not judge
        assert not judge.loaded  # type: ignore[attr-defined]  # lazy: nothing loaded until a call
        assert judge.identity == f"llamacpp:{pack.sha256}"
