"""A loopback OpenAI-compatible server for the network path: role-aware replies and switchable faults.

Roles are told apart by the request's model name (``task-model``, ``judge-model``,
``optimizer-model``). ``faults[role]`` makes every request of that role fail in one of the ways
real endpoints fail; ``prompt_faults[text]`` fails only the requests whose last message holds ``text``.
Like a real endpoint, a reply is cut before the first ``stop`` string and at ``max_tokens`` tokens (a
token is 4 characters here, as the usage counts them). ``in_flight`` / ``peak`` count the requests being answered per role (what a
rate-limited endpoint would see), ``first_s`` / ``last_s`` bound the time the server was busy.
Bounded: 127.0.0.1 only, at most ``max_requests`` answered, stops with the context manager (or by
itself after ``lifetime_s``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("429", "500", "503", "timeout", "reset", "malformed", "empty", "401", "400", "404")


_DSPY_FIELD = re.compile(r"\d+\. `(\w+)` \(([^)]*)\)")


def dspy_reply(system: str, variant: int) -> str | None:
    """A reply in DSPy's chat-adapter format filling the output fields its system message asks for
    (None when the request is not DSPy's): instructions differ per ``variant``, scores are 5."""
    if "Your output fields are:" not in system:
        return None
    section = system.split("Your output fields are:", 1)[1].split("All interactions will be structured", 1)[0]
    parts = []
    for name, kind in _DSPY_FIELD.findall(section):
        if kind.startswith(("int", "float")):
            value = "5"
        elif kind.startswith("bool"):
            value = "True"
        elif "prefix" in name:
            value = "Answer:"
        elif "instruction" in name:
            value = f"Answer from the context, in one sentence (variant {variant})."
        else:
            value = "Using the context: yes."
        parts.append(f"[[ ## {name} ## ]]\n{value}")
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def instruction_of(prompt: str) -> str:
    """The instruction of a rendered QA prompt, before the context or after the query (what a
    scripted task model reacts to; the template's own words about the context are left out)."""
    parts = prompt.split("---------------------")
    if len(parts) < 3:
        return parts[0]
    return parts[0] + re.sub(r"^\s*Query:[^\n]*\n", "", parts[-1])


def limited(text: str, *, stop: str | list[str] | None, max_tokens: int | None) -> tuple[str, str]:
    """``text`` as an endpoint returns it under ``stop`` and ``max_tokens``, with its finish reason."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [text.index(s) for s in stops if s and s in text]
    text = text[: min(cuts)] if cuts else text
    if max_tokens is not None and len(text) > 4 * max_tokens:
        return text[: 4 * max_tokens], "length"
    return text, "stop"


def role_reply(role: str, prompt: str) -> str:
    """What a cooperative model of each role answers (the same truth as the scripted test models)."""
    if role == "task":
        return "Using the context: yes." if "context" in instruction_of(prompt).lower() else "Yes."
    if role == "judge":
        return json.dumps({"score": 5 if "context" in prompt.lower() else 2, "reasoning": "fake server"})
    seed = int(re.search(r"sample (\d+)", prompt).group(1)) if re.search(r"sample (\d+)", prompt) else 0
    return "<INS>Answer from the context, in one sentence.</INS>" if seed % 2 == 0 else "<INS>Answer plainly.</INS>"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A listen backlog like real servers' (uvicorn 2048, nginx 511), not socketserver's 5: a client
    # opening a connection per request in flight would otherwise see resets at start.
    request_queue_size = 512


class FaultServer:
    def __init__(
        self, *, key: str, url_key: str | None = None, latency_s: float = 0.0, max_requests: int = 2000,
        lifetime_s: float = 300.0, keep_alive: bool = False, distinct: bool = False,
    ) -> None:
        self.key = key
        # A second secret some proxies take in the URL (``?api-key=``): required when set.
        self.url_key = url_key
        self.paths: list[str] = []
        self.latency_s = latency_s
        self.max_requests = max_requests
        self.lifetime_s = lifetime_s
        self.faults: dict[str, str] = {}
        self.prompt_faults: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.peak_total = 0
        self.connections = 0  # TCP connections accepted (keep-alive: fewer than requests)
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.lock = threading.Lock()
        # Benchmarks: every optimizer sample proposes a new instruction (none rejected as a duplicate)
        # and every prompt gets its own answer, so no call is a cache hit of another.
        self.distinct = distinct
        server = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 keeps connections open between requests, as real endpoints do.
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            # TCP_NODELAY, as real servers set it: otherwise the body, written after the headers,
            # waits for the client's delayed ACK (40 ms on Linux) and every reply is L + 40 ms.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server.lock:
                    server.connections += 1

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                role = str(body.get("model", "")).removesuffix("-model")
                with server.lock:
                    server.counts[role] += 1
                    server.in_flight[role] += 1
                    server.peak[role] = max(server.peak[role], server.in_flight[role])
                    server.peak_total = max(server.peak_total, sum(server.in_flight.values()))
                    if server.first_s is None:
                        server.first_s = time.time()
                self._role: str | None = role
                try:
                    self._answer(body, role)
                finally:
                    self._served()

            def _served(self) -> None:
                # Counted out before the reply's first byte leaves: a client that got its reply may send
                # its next request at once, and that one must not find this one still counted in flight.
                role, self._role = getattr(self, "_role", None), None
                if role is not None:
                    with server.lock:
                        server.in_flight[role] -= 1
                        server.last_s = time.time()

            def _answer(self, body: dict[str, Any], role: str) -> None:
                with server.lock:
                    total = sum(server.counts.values())
                    fault = server.faults.get(role)
                if total > server.max_requests:
                    return self._send(503, {"error": {"message": "fault server request budget exhausted"}})
                with server.lock:
                    server.paths.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {server.key}" or (
                    server.url_key is not None and f"api-key={server.url_key}" not in self.path
                ):
                    return self._send(401, {"error": {"message": "invalid api key"}})
                time.sleep(server.latency_s)
                messages = body.get("messages") or [{}]
                prompt = str(messages[-1].get("content", ""))
                with server.lock:
                    fault = next((f for text, f in server.prompt_faults.items() if text in prompt), fault)
                if fault is not None:
                    return self._fault(fault)
                system = str(messages[0].get("content", "")) if messages[0].get("role") == "system" else ""
                texts: list[tuple[str, str]] = []
                for i in range(int(body.get("n") or 1)):  # DSPy's COPRO asks for several choices at once
                    with server.lock:
                        variant = sum(server.counts.values()) * 10 + i
                    text = dspy_reply(system, variant)
                    if text is None:
                        text = role_reply(role, prompt + f" sample {body.get('seed') or 0}")
                        if role == "optimizer" and server.distinct:
                            text = text.replace("</INS>", f" (variant {body.get('seed') or 0})</INS>")
                        if role == "task" and server.distinct:  # one answer per prompt: no two judge calls alike
                            text += f" [{hashlib.sha1(prompt.encode()).hexdigest()[:8]}]"
                    texts.append(limited(text, stop=body.get("stop"), max_tokens=body.get("max_tokens")))
                self._send(200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": why}
                                for i, (t, why) in enumerate(texts)],
                    "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": sum(len(t) for t, _ in texts) // 4,
                              "total_tokens": (len(prompt) + sum(len(t) for t, _ in texts)) // 4},
                })

            def _fault(self, fault: str) -> None:
                if fault == "timeout":
                    time.sleep(3.0)
                    return self._send(500, {"error": {"message": "too late"}})
                if fault == "reset":
                    self.connection.close()
                    return None
                if fault == "malformed":
                    return self._raw(200, b"{not json")
                if fault == "empty":
                    return self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                            "choices": []})
                status = int(fault)
                headers = {"Retry-After": "0"} if status == 429 else {}
                return self._send(status, {"error": {"message": f"injected {fault}"}}, headers)

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                self._raw(status, json.dumps(payload).encode(), headers)

            def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self._served()
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.httpd.shutdown)
        self._timer.daemon = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FaultServer:
        self.thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
