"""A persistent cache of LLM calls in SQLite, safe across threads and processes.

Keys come from :func:`opro.llm.cache_key` (backend identity, messages, sampling options, sample
index), values are serialized :class:`opro.llm.Completion`. WAL mode lets several processes (for
example several Optuna workers on one machine) read and write one file.

Built for many concurrent callers: one writer thread commits queued puts in batches (one
transaction, ``synchronous=NORMAL``: a commit survives a killed process, only a power cut can lose
the last ones), readers share a small bounded pool of connections, and a put is visible to ``get``
from the moment it is queued. A kill -9 loses only what was not committed yet: replies received in
the last few milliseconds, which a rerun asks again like the calls that were in flight.
"""

from __future__ import annotations

import atexit
import queue
import sqlite3
import threading
import time
import weakref
from dataclasses import replace
from pathlib import Path

from opro.errors import ConfigError
from opro.llm.client import Completion
from opro.locking import waiting_lock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    completion TEXT NOT NULL,
    created REAL NOT NULL
)
"""
#: Most rows one writer transaction commits; larger queues are committed in several.
_BATCH = 256
#: A queued write: (key, serialized completion), or (key, None) for a delete. None on the queue stops the writer.
_Item = tuple[str, str | None]


class CallCache:
    def __init__(self, path: str | Path, *, max_readers: int = 4) -> None:
        self.path = Path(path).expanduser()
        self._readers: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._max_readers = max(1, max_readers)
        self._n_readers = 0
        self._lock = threading.Lock()
        # Queued but not yet committed puts (None: a queued delete), so reads see their own writes.
        self._pending: dict[str, str | None] = {}
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Condition(self._lock)
        self._unwritten = 0
        self._error: BaseException | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Processes opening a new file together would race on switching it to WAL ("database is
            # locked", read as "not a SQLite file"): the schema is made under a file lock.
            with waiting_lock(self.path.with_name(self.path.name + ".lock")):
                conn = self._connect()
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                conn.close()
        except (OSError, sqlite3.DatabaseError) as exc:
            raise ConfigError(
                f"cannot use {self.path} as the call cache ({exc}): it must be a SQLite file (or a new one) in a "
                "folder opro can write; point the cache elsewhere ([experiment].cache_path, or --cache) or move "
                "that file away"
            ) from None
        self._writer: threading.Thread | None = None
        # Flush at interpreter exit too (a CLI that ends without close() must not drop the last replies).
        atexit.register(_close_at_exit, weakref.ref(self))

    def _connect(self) -> sqlite3.Connection:
        # The timeout waits out other processes' writes.
        conn = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=60000")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # -- readers ---------------------------------------------------------------------------
    def _acquire(self) -> sqlite3.Connection:
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            create = self._n_readers < self._max_readers
            if create:
                self._n_readers += 1
        return self._connect() if create else self._readers.get()

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        conn = self._acquire()
        try:
            return list(conn.execute(sql, args).fetchall())
        finally:
            self._readers.put(conn)

    # -- the writer ------------------------------------------------------------------------
    def _enqueue(self, key: str, value: str | None) -> None:
        with self._lock:
            if self._error is not None:
                raise self._error
            self._pending[key] = value
            self._unwritten += 1
            if self._writer is None:
                # Each writer has its own queue, so a close() racing a put never strands an item.
                self._queue = queue.SimpleQueue()
                self._writer = threading.Thread(
                    target=self._write_loop, args=(self._queue,), name="opro-cache-writer", daemon=True
                )
                self._writer.start()
            self._queue.put((key, value))

    def _write_loop(self, items: queue.SimpleQueue[_Item | None]) -> None:
        conn = self._connect()
        try:
            self._write_batches(conn, items)
        finally:
            conn.close()

    def _write_batches(self, conn: sqlite3.Connection, items: queue.SimpleQueue[_Item | None]) -> None:
        while True:
            first = items.get()
            if first is None:
                return
            batch: list[_Item] = [first]
            stop = False
            while len(batch) < _BATCH:
                try:
                    item = items.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                now = time.time()
                conn.execute("BEGIN IMMEDIATE")
                for key, value in batch:
                    if value is None:
                        conn.execute("DELETE FROM calls WHERE key = ?", (key,))
                    else:
                        conn.execute(
                            "INSERT OR REPLACE INTO calls (key, completion, created) VALUES (?, ?, ?)", (key, value, now)
                        )
                conn.execute("COMMIT")
            except BaseException as exc:  # surfaced to the next caller; the run must not lose replies silently
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                with self._lock:
                    self._error = exc
            with self._lock:
                for key, value in batch:
                    if self._pending.get(key, ...) == value:
                        del self._pending[key]
                self._unwritten -= len(batch)
                self._idle.notify_all()
            if stop:
                return

    def flush(self) -> None:
        """Wait until every queued write is committed."""
        with self._lock:
            while self._unwritten and self._error is None:
                self._idle.wait()
            if self._error is not None:
                raise self._error

    # -- the cache ---------------------------------------------------------------------------
    def get(self, key: str) -> Completion | None:
        with self._lock:
            value = self._pending.get(key, ...)
        if value is ...:
            rows = self._read("SELECT completion FROM calls WHERE key = ?", (key,))
            value = str(rows[0][0]) if rows else None
        if value is None:
            return None
        return replace(Completion.from_json(value), cached=True)

    def put(self, key: str, completion: Completion) -> None:
        self._enqueue(key, replace(completion, cached=False).to_json())

    def delete(self, key: str) -> None:
        self._enqueue(key, None)

    def __len__(self) -> int:
        self.flush()
        return int(self._read("SELECT COUNT(*) FROM calls")[0][0])  # type: ignore[call-overload]

    def clear(self) -> None:
        self.flush()
        conn = self._connect()
        try:
            conn.execute("DELETE FROM calls")
        finally:
            conn.close()

    def close(self) -> None:
        """Commit what is queued and release the connections (a later call opens them again)."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is not None:
                self._queue.put(None)
        if writer is not None:
            writer.join()
        with self._lock:
            while True:
                try:
                    self._readers.get_nowait().close()
                except queue.Empty:
                    break
            self._n_readers = 0


def _close_at_exit(ref: weakref.ReferenceType[CallCache]) -> None:
    cache = ref()
    if cache is not None:
        cache.close()
