"""Opening the search's Optuna study store (SQLite or a database server) from its URL, with the
retries workers starting together need and errors that name the setting."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import optuna

from opro.errors import ConfigError
from opro.locking import waiting_lock
from opro.redaction import redact_url
from opro.search.study import SearchStudy

logger = logging.getLogger(__name__)


def open_storage(url: str, *, where: str = "[tracking].optuna_storage") -> optuna.storages.BaseStorage:
    """The Optuna study store at ``url``; a :class:`ConfigError` naming ``where`` (URL redacted) when it
    cannot be opened: a missing driver, a database that does not answer, a file that is not SQLite.

    SQLite runs in WAL mode with ``synchronous=NORMAL``: the search writes a few attributes per
    candidate and minibatch, and a full fsync each (tens of ms) would stall the requests. A commit
    still survives a killed process; only a power cut can lose the last ones."""
    from sqlalchemy import event
    from sqlalchemy.exc import (
        ArgumentError,
        DatabaseError,
        IntegrityError,
        NoSuchModuleError,
        OperationalError,
        ProgrammingError,
    )

    sqlite = url.startswith("sqlite:///")
    if sqlite:
        path = Path(url.removeprefix("sqlite:///"))
        if path.is_dir():
            raise ConfigError(f"{where} = {url!r} names a folder: name a database file in it (.../optuna.db)")
        path.parent.mkdir(parents=True, exist_ok=True)  # an OSError names the path in the CLI
    for attempt in range(5):
        try:
            # Schema creation of a SQLite file happens under a file lock (as the MLflow store's), so
            # processes and threads starting together do not race on it; a server retries below.
            with waiting_lock(path.with_name(path.name + ".lock")) if sqlite else contextlib.nullcontext():
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else None
                )
            break
        except (OperationalError, IntegrityError, ProgrammingError) as exc:
            # Workers starting together race to create the schema: the loser sees a table that now
            # exists (SQLite: OperationalError; PostgreSQL: ProgrammingError, DuplicateTable), a locked
            # database, or the winner's alembic_version row or table type (IntegrityError: a unique
            # violation), and retries against the finished schema. A database that does not answer
            # fails the same way every time; any other ProgrammingError (a missing privilege) at once.
            why = str(exc.orig or exc).strip().splitlines()[0]
            denied = isinstance(exc, ProgrammingError) and "already exists" not in why
            if attempt < 4 and not denied:
                time.sleep(0.5 * (attempt + 1))
                continue
            if denied:
                hint = "check that the URL's user may create tables in that database"
            elif isinstance(exc, OperationalError):
                hint = "check that the database server is up and the URL's host, port, user and database"
            else:
                hint = "another process kept changing its schema; run again once it has started"
        except (ImportError, ArgumentError, NoSuchModuleError) as exc:
            why, hint = str(exc), (
                "for PostgreSQL install the driver (pip install 'opro[postgres]') and name it in the URL "
                "(postgresql+psycopg2://...)"
            )
        except (DatabaseError, RuntimeError) as exc:  # not a database; or a schema of another Optuna
            why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            hint = "point it at a new file, or move that file away (`optuna storage upgrade` for an older study)"
        raise ConfigError(f"cannot open the Optuna study store {redact_url(url)} ({where}): {why}; {hint}") from None
    if sqlite:

        def pragmas(conn: Any, _record: Any) -> None:
            cursor = conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()  # connections opened while creating the schema get the pragmas too
    return storage


def archive_study(storage: optuna.storages.BaseStorage, *, name: str) -> str | None:
    """Copy the study ``name`` to ``<name>-archived-<time>`` and delete it, so the next run starts fresh;
    the archived study's name (None: there was no study ``name``)."""
    if SearchStudy.load(storage, name=name) is None:
        return None
    archived = f"{name}-archived-{time.strftime('%Y%m%d-%H%M%S')}"
    optuna.copy_study(from_study_name=name, from_storage=storage, to_storage=storage, to_study_name=archived)
    optuna.delete_study(study_name=name, storage=storage)
    logger.warning("archived study %r as %r; starting a fresh study", name, archived)
    return archived


__all__ = ["archive_study", "open_storage"]
