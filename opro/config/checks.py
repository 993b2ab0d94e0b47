"""Checks of config values that need no section type: each numeric key's range, and the tracking stores' URLs.

Kept apart from the sections (:mod:`opro.config`) so that module stays one reader of the TOML; every
name here is re-exported there.
"""

from __future__ import annotations

from opro.errors import ConfigError

# -- numeric ranges ------------------------------------------------------------------------------

#: Allowed range of every numeric key without a dedicated check: (table, {key: (low, high, why)}),
#: inclusive, None for unbounded. One table so a new key is one line, and each error names the key.
RANGES: dict[str, tuple[str, dict[str, tuple[float | None, float | None, str]]]] = {
    "ExperimentSection": ("experiment", {"seed": (0, None, "")}),
    "SplitSection": ("data.split", {"seed": (0, None, "")}),
    "DataSection": ("data", {"max_chunks": (0, None, "0 uses every chunk"),
                             "not_in_context": (0, 0.5, "the share of questions whose context is withheld")}),
    "RAGSection": ("rag", {"answer_max_tokens": (1, None, "the task model's answer length")}),
    "JudgeSection": ("judge", {"max_tokens": (1, None, "the judge's reply length")}),
    "SpaceSection": ("search.space", {"demo_chars": (50, None, "a demonstration's context length")}),
    "TrackingSection": ("tracking", {"worker_wait_s": (1, 86400, "seconds a worker waits for a missing one")}),
    "OptimizerSection": (
        "optimizer",
        {
            "exemplars": (0, None, ""),
            "min_history_score": (0, 100, "on the score scale of the meta-prompt"),
            "max_instruction_chars": (1, None, "longer candidates are rejected"),
            "max_tokens": (1, None, "the optimizer's reply length"),
            "prune_margin": (0, None, ""),
            "prune_warmup_minibatches": (0, None, ""),
            "patience": (0, None, "0 turns early stopping off"),
            "max_calls": (0, None, "0 means no limit"),
            "validation_extension": (0, None, "0: the validation split only"),
            "max_tokens_budget": (0, None, "0 means no limit"),
        },
    ),
}


def check_ranges(section: object) -> None:
    table, keys = RANGES[type(section).__name__]
    for key, (low, high, why) in keys.items():
        value = getattr(section, key)
        if (low is not None and value < low) or (high is not None and value > high):
            allowed = f">= {low:g}" if high is None else f"within {low:g}..{high:g}"
            raise ConfigError(f"[{table}].{key} must be {allowed}, got {value}" + (f" ({why})" if why else ""))


#: Where MLflow keeps runs and its registry (a ``+driver`` may follow the database ones).
_MLFLOW_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
#: The databases Optuna's RDB storage (SQLAlchemy) works with.
_OPTUNA_DIALECTS = ("sqlite", "postgresql", "mysql", "mssql", "oracle")


def _scheme(uri: str) -> str | None:
    """The scheme of ``uri`` without its ``+driver`` (None for a plain path)."""
    head, sep, _ = uri.partition("://")
    return head.split("+", 1)[0].lower() if sep else None


def check_mlflow_uri(uri: str, *, where: str) -> str:
    """``uri`` if MLflow can keep runs there (a local folder, or a scheme MLflow knows); a clear
    :class:`ConfigError` naming ``where`` otherwise, before any MLflow import."""
    scheme = _scheme(uri)
    if scheme is not None and scheme not in _MLFLOW_SCHEMES:
        from opro.redaction import redact_url

        raise ConfigError(
            f"{where} = {redact_url(uri)!r}: MLflow cannot keep runs at a {scheme}:// URI; use sqlite:///PATH/mlflow.db, "
            f"http(s)://HOST:PORT of an MLflow tracking server, a database URL ({', '.join(_MLFLOW_SCHEMES[1:5])}) or "
            "a local folder"
        )
    return uri


def check_optuna_storage(url: str, *, where: str) -> str:
    """``url`` if it is a database URL Optuna can keep a study in; a clear :class:`ConfigError` otherwise."""
    scheme = _scheme(url)
    if scheme not in _OPTUNA_DIALECTS:
        from opro.redaction import redact_url

        raise ConfigError(
            f"{where} = {redact_url(url)!r} is not a database URL Optuna can use: write sqlite:///PATH/optuna.db, or "
            "postgresql+psycopg2://... to share a study between workers (docs/scaling.md)"
        )
    return url


__all__ = ["check_mlflow_uri", "check_optuna_storage", "check_ranges"]

