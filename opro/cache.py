"""A persistent cache of LLM calls in SQLite, safe across threads and processes.

Keys come from :func:`opro.llm.cache_key` (backend identity, messages, sampling options, sample
index), values are serialized :class:`opro.llm.Completion`. WAL mode lets several processes (for
example several Optuna workers on one machine) read and write one file.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

from opro.llm import Completion

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    completion TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class CallCache:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        conn = self._conn()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        conn.commit()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # One connection per thread; the timeout waits out other processes' writes.
            conn = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=60000")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def get(self, key: str) -> Completion | None:
        row = self._conn().execute("SELECT completion FROM calls WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return replace(Completion.from_json(row[0]), cached=True)

    def put(self, key: str, completion: Completion) -> None:
        conn = self._conn()
        stored = replace(completion, cached=False)
        with conn:
            conn.execute(
                "INSERT OR REPLACE INTO calls (key, completion, created) VALUES (?, ?, ?)",
                (key, stored.to_json(), time.time()),
            )

    def delete(self, key: str) -> None:
        with self._conn() as conn:
            conn.execute("DELETE FROM calls WHERE key = ?", (key,))

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def clear(self) -> None:
        with self._conn() as conn:
            conn.execute("DELETE FROM calls")

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()
