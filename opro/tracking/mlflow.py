"""MLflow tracking of an optimization: params, per-candidate metrics, artifacts, the prompt registry.

Uses an explicit :class:`mlflow.MlflowClient` (no global tracking URI is set), so several
optimizations, tests or notebooks in one process never write into each other's stores.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError, OproError
from opro.redaction import redact_text

if TYPE_CHECKING:
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

#: MLflow's usage telemetry (an installation id written under ~/.config/mlflow, events sent to MLflow's
#: servers) is off in a tool that runs offline first; ``MLFLOW_DISABLE_TELEMETRY=false`` turns it on.
TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true"}


def offline_environment(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` with MLflow's telemetry off unless it says otherwise (a user's own setting wins): read by
    MLflow once, when it is imported, so set before that in this process and in every MLflow child
    (the sidecar inherits it; ``opro ui``'s server gets it)."""
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    return env


_SECRET_KEY_RE = re.compile(r"(api[_-]?key|secret|token|password)$", re.I)


def check_server(tracking_uri: str, *, where: str = "[tracking].mlflow_uri", timeout_s: float = 5.0) -> None:
    """Fail at once, naming ``where``, when ``tracking_uri`` is an MLflow server that does not answer:
    MLflow's client would retry a refused connection for about two minutes per call. Any HTTP reply
    counts as an answer (a server behind a login may refuse the health check). Stores that are not
    servers (SQLite, a folder, a database) are left to MLflow."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    import http.client
    import urllib.error
    import urllib.parse
    import urllib.request

    from opro.redaction import redact_url

    try:
        parts = urllib.parse.urlsplit(tracking_uri)
        # Credentials in the URI are MLflow's to send; urllib would read them as part of the host name.
        host = parts.netloc.rpartition("@")[2]
        probe = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/") + "/health", "", ""))
        with urllib.request.urlopen(probe, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (ValueError, http.client.InvalidURL) as exc:
        raise ConfigError(f"{where} = {redact_url(tracking_uri)!r} is not a valid URL ({exc})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"cannot reach the MLflow tracking server at {redact_url(tracking_uri)} ({where}): {reason}; start it "
            "(`mlflow server --host HOST --port PORT`), fix the URI, or leave [tracking].mlflow_uri empty for a "
            "SQLite store in the run's folder"
        ) from None


def check_writable(tracking_uri: str, *, where: str = "[tracking].mlflow_uri", off: str = "--no-mlflow") -> None:
    """Fail at once, before any call or file, when the MLflow store at ``tracking_uri`` cannot record:
    a server that does not answer (:func:`check_server`), or a SQLite file or store folder that cannot be
    written or created. The error names ``where`` and ``off``, the option that records nothing. Other
    stores (a database server) are left to MLflow."""
    from opro.paths import unwritable
    from opro.redaction import redact_url

    if tracking_uri.startswith(("http://", "https://")):
        check_server(tracking_uri, where=where)
        return
    if tracking_uri.startswith("sqlite:///"):
        why = unwritable(Path(tracking_uri.removeprefix("sqlite:///")), folder=False)
    elif tracking_uri.startswith("file:") or "://" not in tracking_uri:
        why = unwritable(Path(tracking_uri.removeprefix("file://").removeprefix("file:")), folder=True)
    else:
        return
    if why is not None:
        raise ConfigError(f"the MLflow store {redact_url(tracking_uri)} ({where}) cannot record: {why}. Make it "
                          f"writable, point {where} at a store this user may write, or run with {off} to record "
                          "nothing; nothing was asked or written")


def _client(tracking_uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    if tracking_uri.startswith("sqlite:///"):
        return _init_sqlite_store(tracking_uri, Path(tracking_uri.removeprefix("sqlite:///")))
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _init_sqlite_store(tracking_uri: str, db: Path) -> MlflowClient:
    """Create (and migrate) a SQLite store under a file lock, and return a client on it.

    Two processes starting on a new folder would otherwise both run MLflow's schema migration on
    the same file and leave it broken for good (``table _alembic_tmp_tags already exists``).
    MLflow builds the store when the client is constructed, so construction happens under the lock.
    """
    import sqlite3

    from mlflow import MlflowClient

    from opro.locking import waiting_lock

    db.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(db.with_name(db.name + ".lock")):
        try:
            if db.is_file():
                # No opro migration runs while we hold the lock: a scratch table is what an interrupted
                # one left behind, and MLflow's next migration would fail on it for good.
                with sqlite3.connect(db) as conn:
                    names = [r[0] for r in conn.execute(
                        "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE '\\_alembic\\_tmp\\_%' ESCAPE '\\'")]
                    for name in names:
                        conn.execute(f'DROP TABLE "{name}"')
                if names:
                    logger.warning("repaired %s: dropped %s left by an interrupted migration", db, ", ".join(names))
            new = not db.is_file()
            copied = new and _copy_empty_store(db)
            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            client.search_experiments(max_results=1)
        except Exception as exc:
            raise OproError(
                f"the MLflow store {db} cannot be opened ({type(exc).__name__}: {str(exc)[:200]}); move it aside "
                "and rerun (the Optuna study keeps every result, so nothing is lost)"
            ) from exc
        if new and not copied:
            _save_empty_store(db)
        return client


def _empty_store_path() -> Path:
    import mlflow

    from opro.paths import cache_dir

    return cache_dir() / "mlflow" / f"empty-store-{mlflow.__version__}.sqlite"


def _copy_empty_store(db: Path) -> bool:
    """Start a new SQLite store from a copy of an empty, migrated one (kept per MLflow version in the
    cache dir): building the schema through MLflow's ~50 migrations costs about 5 s of CPU, a copy
    milliseconds. The copy's default experiment gets the artifact folder MLflow itself would give it."""
    import sqlite3

    template = _empty_store_path()
    if not template.is_file():
        return False
    try:
        with sqlite3.connect(template) as src, sqlite3.connect(db) as dst:
            src.backup(dst)
            dst.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                        (str(Path.cwd() / "mlruns" / "0"),))
    except sqlite3.Error as exc:  # a damaged template: build the store the slow way
        logger.warning("cannot copy the empty MLflow store %s (%s); creating the store from scratch", template, exc)
        db.unlink(missing_ok=True)
        return False
    return True


def _save_empty_store(db: Path) -> None:
    """Keep a copy of a store MLflow just created (nothing in it yet) for :func:`_copy_empty_store`."""
    import os
    import sqlite3

    template = _empty_store_path()
    if template.is_file():
        return
    tmp = template.with_name(f"{template.name}.{os.getpid()}.tmp")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(db) as src, sqlite3.connect(tmp) as dst:
            if src.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] != 1:
                return  # not empty any more (another process already uses it): do not keep its data
            src.backup(dst)
        os.replace(tmp, template)
    except (OSError, sqlite3.Error) as exc:  # only a speed-up: never fail a run for it
        logger.debug("cannot keep an empty MLflow store at %s: %s", template, exc)
    finally:
        tmp.unlink(missing_ok=True)


def safe_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Flatten to MLflow params; refuse anything that looks like a secret rather than log it."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if _SECRET_KEY_RE.search(key) and not key.endswith("_env"):
            raise OproError(f"refusing to log parameter {key!r}: it looks like a secret")
        text = redact_text(str(value))  # a base_url may carry a key in userinfo or a query value
        out[key] = text if len(text) <= 6000 else text[:5997] + "..."
    return out


def to_mlflow_template(template_text: str) -> str:
    """``{context_str}`` -> ``{{context_str}}``: the Prompt Registry's variable syntax."""
    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", r"{{\1}}", template_text)


def from_mlflow_template(template_text: str) -> str:
    """``{{context_str}}`` -> ``{context_str}``."""
    return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", r"{\1}", template_text)


class MlflowTracker:
    """One MLflow run per optimization, resumable by run id."""

    def __init__(self, *, tracking_uri: str, experiment_name: str) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self._client: MlflowClient | None = None
        self.run_id: str | None = None

    @property
    def client(self) -> MlflowClient:
        """Opened (and the store created) on first use, so building a tracker costs nothing up front."""
        if self._client is None:
            self._client = _client(self.tracking_uri)
        return self._client

    def open(self) -> None:
        """Open the client now (MLflow's import and the store's set-up: seconds), not at the first call."""
        _ = self.client

    def start(self, *, run_name: str, params: Mapping[str, Any], resume_run_id: str | None = None) -> str:
        if resume_run_id:
            from mlflow.exceptions import MlflowException

            try:
                run = self.client.get_run(resume_run_id)
            except MlflowException:
                # The study's run lives in another store (a worker or folder with its own MLflow):
                # record this resume as a new run here rather than fail.
                logger.warning("MLflow run %s of this study is not in %s; starting a new run",
                               resume_run_id, redact_text(self.tracking_uri))
            else:
                self.run_id = run.info.run_id
                if run.info.status != "RUNNING":
                    self.client.update_run(self.run_id, status="RUNNING")
                return self.run_id
        run = self.client.create_run(self.experiment_id(), run_name=run_name, tags={"opro.kind": "optimization"})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in safe_params(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        return self.run_id

    def experiment_id(self) -> str:
        """The experiment's id, created (artifacts beside a SQLite store) if it does not exist yet."""
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(self.client.create_experiment(self.experiment_name, artifact_location=self._artifact_location()))
        except MlflowException:
            # Another client (the GenAI records' thread, another worker) created it meanwhile.
            exp = self.client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def _artifact_location(self) -> str | None:
        # A SQLite store would put artifacts in ./mlruns of whatever directory the process runs in;
        # keep them beside the database instead. A tracking server decides for itself.
        if self.tracking_uri.startswith("sqlite:///"):
            db = Path(self.tracking_uri.removeprefix("sqlite:///"))
            return (db.parent / "mlartifacts").resolve().as_uri()
        return None

    def _require_run(self) -> str:
        if self.run_id is None:
            raise OproError("MlflowTracker: call start() first")
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params of the run; one already logged with another value stays as it was (MLflow keeps
        params immutable), and is said so in the log."""
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        run_id = self._require_run()
        try:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in safe_params(params).items()])
        except MlflowException as exc:
            logger.warning("MLflow run %s keeps its earlier params (%s)", run_id, str(exc)[:200])

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        import time

        from mlflow.entities import Metric

        run_id = self._require_run()
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_artifact(self, path: Path, *, artifact_path: str | None = None) -> None:
        run_id = self._require_run()
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path=artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        run_id = self._require_run()
        for k, v in tags.items():
            self.client.set_tag(run_id, k, redact_text(str(v)))

    def finish(self, *, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)

    def register_prompt(
        self,
        *,
        name: str,
        template_text: str,
        alias: str | None,
        commit_message: str,
        tags: Mapping[str, str] | None = None,
    ) -> int:
        """Register ``template_text`` as a new version (``{{var}}`` syntax) and point ``alias`` at it."""
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ConfigError(f"prompt name {name!r}: use letters, digits, '_', '-' and '.' only")
        version = self.client.register_prompt(
            name=name,
            template=to_mlflow_template(template_text),
            commit_message=commit_message,
            tags=dict(tags or {}),
        )
        if alias:
            self.client.set_prompt_alias(name, alias=alias, version=int(version.version))
        if self.run_id is not None:
            self._link_prompt(version)
        return int(version.version)

    def _link_prompt(self, version: Any) -> None:
        # MlflowClient.link_prompt_version_to_run looks the run up in the *global* tracking store, not
        # this client's; set the same tag (what the UI reads) through this client instead.
        from mlflow.tracing.constant import TraceTagKey
        from mlflow.tracing.utils.prompt import update_linked_prompts_tag

        run_id = self._require_run()
        current = self.client.get_run(run_id).data.tags.get(TraceTagKey.LINKED_PROMPTS)
        self.client.set_tag(run_id, TraceTagKey.LINKED_PROMPTS, update_linked_prompts_tag(current, [version]))


def load_registered_template(*, tracking_uri: str, uri: str) -> str:
    """``prompts:/name@alias`` or ``prompts:/name/3`` -> the template in opro's ``{var}`` syntax."""
    return load_registered_prompt(tracking_uri=tracking_uri, uri=uri)[0]


def load_registered_prompt(*, tracking_uri: str, uri: str) -> tuple[str, dict[str, str]]:
    """The template of ``prompts:/name@alias`` / ``prompts:/name/3`` in opro's ``{var}`` syntax, and
    the version's tags (where opro records the run a prompt came from)."""
    client = _client(tracking_uri)
    try:
        prompt = client.load_prompt(uri)
    except Exception as exc:  # MLflow raises its own exception types for a missing prompt
        raise ConfigError(f"cannot load prompt {uri!r} from {tracking_uri}: {exc}") from exc
    if prompt is None:
        raise ConfigError(f"prompt {uri!r} not found in {tracking_uri}")
    return from_mlflow_template(str(prompt.template)), {str(k): str(v) for k, v in (prompt.tags or {}).items()}


def tag_prompt_version(*, tracking_uri: str, name: str, version: int, tags: Mapping[str, str]) -> None:
    """Set tags on a registered prompt version (the held-out evidence a promotion rests on)."""
    client = _client(tracking_uri)
    for key, value in tags.items():
        client.set_prompt_version_tag(name, str(version), key, value)


def run_params(*, tracking_uri: str, run_id: str) -> dict[str, str]:
    """A run's logged params; raises MLflow's own errors for a missing run or store."""
    from mlflow import MlflowClient

    return dict(MlflowClient(tracking_uri=tracking_uri).get_run(run_id).data.params)


__all__ = [
    "MlflowTracker",
    "check_server",
    "from_mlflow_template",
    "load_registered_prompt",
    "load_registered_template",
    "run_params",
    "safe_params",
    "tag_prompt_version",
    "to_mlflow_template",
]
