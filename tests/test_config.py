"""Range checks of every numeric config key: the error names the table, the key, the value and the range."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from opro.config import (
    DataSection,
    ExperimentSection,
    JudgeSection,
    OptimizerSection,
    RAGSection,
    SplitSection,
    config_from_dict,
    load_config,
)
from opro.errors import ConfigError

_TABLES: list[tuple[str, type[Any]]] = [
    ("experiment", ExperimentSection),
    ("data.split", SplitSection),
    ("data", DataSection),
    ("rag", RAGSection),
    ("judge", JudgeSection),
    ("optimizer", OptimizerSection),
]


def _config(table: str, key: str, value: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"data": {"docs": ["docs"]}}
    if table == "data.split":
        cfg["data"]["split"] = {key: value}
    elif table == "data":
        cfg["data"][key] = value
    else:
        cfg[table] = {key: value}
    return cfg


def _numeric_keys() -> list[tuple[str, str]]:
    keys = []
    for table, cls in _TABLES:
        hints = typing.get_type_hints(cls)
        keys += [(table, f.name) for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]
    return keys


@pytest.mark.parametrize(("table", "key"), _numeric_keys())
def test_every_numeric_key_rejects_a_negative_value_by_name(tmp_path: Path, table: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(_config(table, key, -1000), base_dir=tmp_path, source="bad.toml")
    message = str(info.value)
    assert message.startswith("bad.toml: ")
    assert f"[{table}].{key} must be" in message and "-1000" in message


@pytest.mark.parametrize(
    ("table", "key", "value", "message"),
    [
        ("optimizer", "patience", -1, r"\[optimizer\]\.patience must be >= 0, got -1 \(0 turns early stopping off\)"),
        ("optimizer", "max_calls", -5, r"\[optimizer\]\.max_calls must be >= 0, got -5"),
        ("optimizer", "max_instruction_chars", 0, r"\[optimizer\]\.max_instruction_chars must be >= 1, got 0"),
        ("optimizer", "max_tokens", 0, r"\[optimizer\]\.max_tokens must be >= 1, got 0"),
        ("optimizer", "min_history_score", 7.0, r"\[optimizer\]\.min_history_score must be within 0\.\.5"),
        ("rag", "answer_max_tokens", 0, r"\[rag\]\.answer_max_tokens must be >= 1, got 0"),
        ("rag", "chunk_overlap", 512, r"\[rag\]\.chunk_overlap must be in \[0, chunk_size\)"),
        ("judge", "max_tokens", 0, r"\[judge\]\.max_tokens must be >= 1, got 0"),
        ("data", "max_chunks", -1, r"\[data\]\.max_chunks must be >= 0, got -1"),
        ("experiment", "seed", -3, r"\[experiment\]\.seed must be >= 0, got -3"),
    ],
)
def test_out_of_range_values_are_named(tmp_path: Path, table: str, key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(_config(table, key, value), base_dir=tmp_path, source="bad.toml")


def test_boundary_values_are_accepted(tmp_path: Path) -> None:
    cfg = _config("optimizer", "patience", 0)
    cfg["optimizer"].update(max_calls=0, max_tokens_budget=0, exemplars=0, max_instruction_chars=1)
    cfg["rag"] = {"answer_max_tokens": 1}
    assert config_from_dict(cfg, base_dir=tmp_path).optimizer.max_instruction_chars == 1
    cfg["optimizer"].update(score_scale="0-100", min_history_score=50.0)
    assert config_from_dict(cfg, base_dir=tmp_path).optimizer.min_history_score == 50.0


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        # NaN passes every range check (each comparison is false): refused by type, for any float key.
        ({"optimizer": {"prune_margin": float("nan")}}, "optimizer.prune_margin must be a number, got nan"),
        # A non-inferiority claim at margin 0 would be a gain worded as "not worse" (issue 61, as compare --margin).
        ({"optimizer": {"objective": "cost", "margin": 0}}, '[optimizer].margin must be a positive number of judge '
                                                            'points (e.g. 0.25) with objective = "cost", got 0'),
        ({"tracking": {"worker_wait_s": float("nan")}}, "tracking.worker_wait_s must be a number, got nan"),
        ({"models": {"task": {"backend": "openai", "model": "m", "timeout_s": float("nan")}}},
         "models.task.timeout_s must be a number, got nan"),
        # A role's own checks say which role.
        ({"models": {"judge": {"backend": "openai", "model": "m", "base_url": "localhost:8000"}}},
         "[models.judge] base_url must start with http://"),
        ({"models": 3}, "models must be a table"),
        ({"optimizer": {"seen_validation": "ignore"}},
         "optimizer.seen_validation = 'ignore' is not allowed; use one of 'refuse', 'label'"),
        ({"tracking": {"mlflow_uri": "bogus://x"}}, "[tracking].mlflow_uri = 'bogus://x': MLflow cannot keep runs"),
        ({"tracking": {"optuna_storage": "runs/optuna.db"}}, "[tracking].optuna_storage = 'runs/optuna.db' is not a "
                                                              "database URL"),
        ({"data": {"docs": ["builtin:nope"]}}, "[data].docs[0] = 'builtin:nope' is not a built-in corpus"),
        ({"data": {"docs": ["docs", " "]}}, "[data].docs[1] is empty"),
        ({"experiment": {"output_dir": ""}}, "[experiment].output_dir is empty"),
        ({"rag": {"initial_instructions": ["Answer.", " "]}}, "[rag].initial_instructions[1] is empty"),
        ({"rag": {"initial_instructions": ["Answer {the question."]}},
         "[rag].initial_instructions[0]: the instruction has 1 unmatched '{'"),
        ({"rag": {"retriever": "dense", "embeddings": {"base_url": "http://127.0.0.1:9/v1"}}},
         "[rag.embeddings] needs `model`"),
        ({"rag": {"retriever": "dense", "embeddings": {"model": "e", "base_url": "localhost:8000"}}},
         "[rag.embeddings].base_url must start with http://"),
        ({"rag": {"retriever": "dense", "embeddings": {"model": "e", "api_key_env": "sk-secret-key"}}},
         "[rag.embeddings].api_key_env must be the NAME of an environment variable"),
    ],
)
def test_bad_values_fail_at_load_naming_the_key(cfg: dict[str, Any], message: str) -> None:
    data: dict[str, Any] = {"data": {"docs": ["docs"]}, **cfg}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="exp.toml")
    assert message in str(info.value)
    assert "secret-key" not in str(info.value)


@pytest.mark.parametrize(("cfg", "message"), [
    ({"experimnet": {"name": "x"}}, "unknown key experimnet (did you mean [experiment]?)"),
    ({"data": {"docs": ["docs"], "datset": "qa.jsonl"}}, "unknown key [data].datset (did you mean [data].dataset?)"),
    ({"optimizer": {"stepz": 3}}, "unknown key [optimizer].stepz (did you mean [optimizer].steps?)"),
    ({"models": {"jduge": {}}}, "unknown key [models].jduge (did you mean [models.judge]?)"),
    ({"models": {"judge": {"max_concurency": 2}}},
     "unknown key [models.judge].max_concurency (did you mean [models.judge].max_concurrency?)"),
    ({"search": {"space": {"topk": [1, 2]}}}, "unknown key [search.space].topk (did you mean [search.space].top_k?)"),
    ({"data": {"docs": ["docs"], "split": {"held_out": 4}}},
     "unknown key [data.split].held_out (did you mean [data.split].heldout?)"),
])
def test_an_unknown_key_is_answered_with_the_closest_allowed_one(cfg: dict[str, Any], message: str) -> None:
    data: dict[str, Any] = {"data": {"docs": ["docs"]}, **cfg}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="exp.toml")
    assert message in str(info.value)


def test_an_unknown_key_far_from_every_allowed_one_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"data": {"docs": ["docs"]}, "optimizer": {"zzz": 1}}, source="exp.toml")
    assert "unknown key [optimizer].zzz; allowed keys in [optimizer]:" in str(info.value)


def test_good_tracking_uris_are_accepted() -> None:
    for mlflow_uri, optuna_storage in [
        ("sqlite:///runs/mlflow.db", "sqlite:///runs/optuna.db"),
        ("http://127.0.0.1:5000", "postgresql+psycopg2://u@127.0.0.1/db"),
        ("runs/mlruns", "mysql://u@h/db"),
        ("databricks", "postgresql://u@h/db"),
    ]:
        cfg = config_from_dict({"data": {"docs": ["docs"]}, "tracking": {"mlflow_uri": mlflow_uri,
                                                                        "optuna_storage": optuna_storage}})
        assert cfg.mlflow_uri == mlflow_uri and cfg.optuna_storage == optuna_storage


def test_a_config_file_must_be_utf8_and_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    latin = tmp_path / "latin.toml"
    latin.write_bytes('[experiment]\nname = "caf\u00e9"\n[data]\ndocs = ["docs"]\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.toml: not UTF-8 text \(byte \d+\): save the config as UTF-8"):
        load_config(latin)
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + '[experiment]\nname = "caf\u00e9"\n[data]\ndocs = ["docs"]\n'.encode())
    assert load_config(bom).experiment.name == "caf\u00e9"


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "experiments").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_experiment_config_loads(path: Path) -> None:
    # The worked examples the docs run: a renamed or mistyped key fails here, not in a user's hour-long run.
    config = load_config(path)
    assert config.experiment.name and config.source == str(path)
