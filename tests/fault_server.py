"""A loopback OpenAI-compatible server for the network path: role-aware replies and switchable faults.

Roles are told apart by the request's model name (``task-model``, ``judge-model``,
``optimizer-model``). ``faults[role]`` makes every request of that role fail in one of the ways
real endpoints fail. Bounded: 127.0.0.1 only, at most ``max_requests`` answered, stops with the
context manager (or by itself after ``lifetime_s``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("429", "500", "503", "timeout", "reset", "malformed", "empty", "401", "400", "404")


def role_reply(role: str, prompt: str) -> str:
    """What a cooperative model of each role answers (the same truth as the scripted test models)."""
    if role == "task":
        return "Using the context: yes." if "context" in prompt.split("---------------------")[0].lower() else "Yes."
    if role == "judge":
        return json.dumps({"score": 5 if "context" in prompt.lower() else 2, "reasoning": "fake server"})
    seed = int(re.search(r"sample (\d+)", prompt).group(1)) if re.search(r"sample (\d+)", prompt) else 0
    return "<INS>Answer from the context, in one sentence.</INS>" if seed % 2 == 0 else "<INS>Answer plainly.</INS>"


class FaultServer:
    def __init__(
        self, *, key: str, url_key: str | None = None, latency_s: float = 0.0, max_requests: int = 2000,
        lifetime_s: float = 300.0,
    ) -> None:
        self.key = key
        # A second secret some proxies take in the URL (``?api-key=``): required when set.
        self.url_key = url_key
        self.paths: list[str] = []
        self.latency_s = latency_s
        self.max_requests = max_requests
        self.lifetime_s = lifetime_s
        self.faults: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                role = str(body.get("model", "")).removesuffix("-model")
                with server.lock:
                    server.counts[role] += 1
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
                if fault is not None:
                    return self._fault(fault)
                messages = body.get("messages") or [{}]
                prompt = str(messages[-1].get("content", ""))
                text = role_reply(role, prompt + f" sample {body.get('seed') or 0}")
                self._send(200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                              "total_tokens": (len(prompt) + len(text)) // 4},
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
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
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
