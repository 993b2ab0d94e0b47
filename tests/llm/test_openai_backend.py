"""The openai backend against a fake OpenAI-compatible server on 127.0.0.1 (no network)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fault_server import FaultServer

from opro.errors import (
    ConfigError,
    LLMAuthError,
    LLMBadRequestError,
    LLMConnectionError,
    LLMError,
    LLMRateLimitError,
    LLMServerError,
    LLMTimeoutError,
)
from opro.llm import ChatClient, GenerationOptions, Message
from opro.llm.openai import OpenAILLM, _sdk_http, http_pool, parse_retry_after

SECRET = "sk-test-very-secret-0123456789"


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def ok(text: str = "hello", *, logprobs: bool = False) -> Reply:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {
                    "token": "4",
                    "logprob": -0.1,
                    "bytes": None,
                    "top_logprobs": [
                        {"token": "4", "logprob": -0.1, "bytes": None},
                        {"token": "5", "logprob": -2.5, "bytes": None},
                    ],
                }
            ]
        }
    return Reply(
        body={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-model",
            "choices": [choice],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
        }
    )


def error(status: int, message: str = "nope", headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "x"}}, headers=headers or {})


class FakeServer:
    """Serves scripted replies in order (the last one repeats) and records the requests."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.times: list[float] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "json": payload})
                    server.times.append(time.monotonic())
                    reply = server.replies.pop(0) if len(server.replies) > 1 else server.replies[0]
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = json.dumps(reply.body or {}).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies = list(replies)
            self.requests.clear()
            self.times.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def llm(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAILLM]:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(
        model="fake-model",
        base_url=server.url,
        api_key_env="OPRO_TEST_KEY",
        timeout_s=2.0,
        max_retries=3,
        max_retry_wait_s=10.0,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        seed=0,
    )
    yield backend
    backend.close()


MSGS = (Message("user", "What is 2+2?"),)
OPTS = GenerationOptions(temperature=0.0, max_tokens=5, seed=7)


def test_success_maps_text_usage_and_request(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(ok("4"))
    c = llm.generate(MSGS, GenerationOptions(max_tokens=5, seed=7, stop=("\n",), json_schema='{"type":"object"}'))
    assert (c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) == ("4", 11, 3, "stop")
    assert c.latency_s > 0
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {SECRET}"
    body = req["json"]
    assert body["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert body["seed"] == 7 and body["stop"] == ["\n"] and body["max_tokens"] == 5
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_extra_headers_and_unicode_reach_the_server_on_the_sync_path(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY",
                        extra_headers={"X-Team": "rag"}, max_retries=0)
    try:
        server.script(ok("Köln"))
        c = backend.generate((Message("user", "Où est Köln?"),), OPTS)
    finally:
        backend.close()
    assert c.text == "Köln"
    req = server.requests[0]
    assert req["headers"]["X-Team"] == "rag"
    assert req["json"]["messages"][0]["content"] == "Où est Köln?"


def test_top_logprobs_are_requested_and_mapped(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(ok("4", logprobs=True))
    c = llm.generate(MSGS, GenerationOptions(top_logprobs=2))
    assert server.requests[0]["json"]["logprobs"] is True
    assert server.requests[0]["json"]["top_logprobs"] == 2
    assert c.top_logprobs == ({"4": -0.1, "5": -2.5},)


def test_429_with_retry_after_then_success(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(error(429, "slow down", {"Retry-After": "0.3"}), ok("fine"))
    assert llm.generate(MSGS, OPTS).text == "fine"
    assert len(server.requests) == 2
    # The Retry-After of 0.3 s was honoured, although the jittered backoff is at most 0.05 s.
    assert server.times[1] - server.times[0] >= 0.28


def test_a_long_retry_wait_is_announced_and_a_short_backoff_is_not(
    server: FakeServer, llm: OpenAILLM, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import opro.llm.openai as backend_module

    monkeypatch.setattr(backend_module, "LOUD_WAIT_S", 0.25)  # the threshold, scaled to a test's waits
    server.script(error(429, "slow down", {"Retry-After": "0.3"}), error(500), ok("fine"))
    with caplog.at_level(logging.WARNING, logger="opro.llm.openai"):
        assert llm.generate(MSGS, OPTS).text == "fine"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # the 500's jittered backoff (at most 0.05 s here) is routine: not said
    assert "waiting 0 s before retry 1 of" in said[0] and "Retry-After" in said[0] and "slow down" in said[0]
    assert SECRET not in caplog.text


def test_500_then_success(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(error(500), error(503), ok("after 5xx"))
    assert llm.generate(MSGS, OPTS).text == "after 5xx"
    assert len(server.requests) == 3


def test_timeout_is_retried_then_raises(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(
        model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY", timeout_s=0.2,
        max_retries=1, backoff_base_s=0.01, backoff_max_s=0.01,
    )
    server.script(Reply(delay_s=1.0, body=ok().body))
    t0 = time.monotonic()
    with pytest.raises(LLMTimeoutError, match="timed out") as info:
        backend.generate(MSGS, OPTS)
    assert time.monotonic() - t0 < 3.0
    assert len(server.requests) == 2
    assert info.value.model == "fake-model" and info.value.provider == "openai"
    backend.close()


def test_timeout_then_success(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(
        model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY", timeout_s=0.2,
        max_retries=2, backoff_base_s=0.01, backoff_max_s=0.01,
    )
    server.script(Reply(delay_s=1.0, body=ok().body), ok("second try"))
    assert backend.generate(MSGS, OPTS).text == "second try"
    backend.close()


@pytest.mark.parametrize(
    ("status", "exc"),
    [(401, LLMAuthError), (403, LLMAuthError), (400, LLMBadRequestError), (404, LLMBadRequestError),
     (422, LLMBadRequestError)],
)
def test_client_errors_are_not_retried(server: FakeServer, llm: OpenAILLM, status: int, exc: type[Exception]) -> None:
    server.script(error(status, "bad thing"), ok())
    with pytest.raises(exc, match="bad thing") as info:
        llm.generate(MSGS, OPTS)
    assert len(server.requests) == 1
    assert info.value.status == status  # type: ignore[attr-defined]
    assert SECRET not in str(info.value)


def test_retry_budget_exhausted_by_count(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(error(500, "down"))
    with pytest.raises(LLMServerError, match="gave up after 4 attempts"):
        llm.generate(MSGS, OPTS)
    assert len(server.requests) == 4  # 1 + max_retries


def test_retry_budget_exhausted_by_time(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(
        model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY", max_retries=10,
        max_retry_wait_s=1.0,
    )
    # The server asks for 30 s, more than the 1 s budget: wait what the budget allows, try once
    # more, then fail visibly (never wait 30 s, never drop the call silently).
    server.script(error(429, "quota", {"Retry-After": "30"}), error(429, "quota", {"Retry-After": "30"}))
    t0 = time.monotonic()
    with pytest.raises(LLMRateLimitError) as info:
        backend.generate(MSGS, OPTS)
    assert 0.9 < time.monotonic() - t0 < 3.0
    assert info.value.retry_after == pytest.approx(30.0)
    assert len(server.requests) == 2 and "gave up after 2 attempts" in str(info.value)
    backend.close()


def test_oversized_retry_after_is_capped_then_retried(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY")
    backend.policy = replace(backend.policy, max_retry_after_s=0.2)
    # 300 s asked for (past the old 120 s limit, which dropped the call): capped at 0.2 s, then it succeeds.
    server.script(error(429, "slow down", {"Retry-After": "300"}), ok("after the wait"))
    t0 = time.monotonic()
    assert backend.generate(MSGS, OPTS).text == "after the wait"
    assert time.monotonic() - t0 < 5.0 and len(server.requests) == 2
    backend.close()


def test_empty_choices_are_retried_like_a_server_error(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    backend = OpenAILLM(model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY", backoff_base_s=0.01)
    empty = ok("x")
    assert empty.body is not None
    empty.body["choices"] = []
    server.script(empty, ok("now a real answer"))
    assert backend.generate(MSGS, OPTS).text == "now a real answer"
    assert len(server.requests) == 2
    # Always empty: the call fails visibly, naming the server (never a silent empty answer).
    server.script(*([empty] * 10))
    with pytest.raises(LLMServerError, match=r"returned no choices.*gave up after"):
        backend.generate(MSGS, OPTS)
    backend.close()


def test_permanent_errors_name_the_role_the_server_and_what_to_fix(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    url = server.url.replace("http://", f"http://user:{SECRET}@") + f"?api-key={SECRET}"
    backend = OpenAILLM(model="fake-model", base_url=server.url, api_key_env="OPRO_TEST_KEY")
    client = ChatClient(backend, role="judge")
    for status, pattern in ((401, "authentication failed"), (404, "not found"), (400, "request rejected")):
        server.script(error(status, "nope"))
        with pytest.raises(LLMError) as info:
            client.complete("hi")
        text = str(info.value)
        assert info.value.permanent and len(server.requests) >= 1
        assert text.startswith("judge model: ") and pattern in text and server.url in text
        assert "fix [models.judge]" in text
    backend.close()
    # Credentials in the URL never reach the message.
    leaky = OpenAILLM(model="fake-model", base_url=url, api_key_env="OPRO_TEST_KEY")
    assert SECRET not in str(leaky.convert_error(RuntimeError("boom")))
    import openai

    status_error = openai.APIConnectionError(request=_sdk_http().Request("POST", url))
    message = str(leaky.convert_error(status_error))
    assert SECRET not in message and "***" in message
    leaky.close()


def test_connection_error_is_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    backend = OpenAILLM(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_base_s=0.01)
    with pytest.raises(LLMConnectionError, match="cannot reach"):
        backend.generate(MSGS, OPTS)


def test_a_redirect_is_followed(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(Reply(status=307, headers={"Location": server.url + "/chat/completions?moved=1"}), ok("moved"))
    assert llm.generate(MSGS, OPTS).text == "moved"
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions", "/v1/chat/completions?moved=1"]
    assert server.requests[1]["json"]["messages"][0]["content"] == "What is 2+2?"  # a 307 keeps the POST


def test_calls_in_flight_keep_their_connections_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """One kept-alive connection per call in flight, reused by the next calls: not one per call."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    with FaultServer(key=SECRET, latency_s=0.02, keep_alive=True) as fault:
        backend = OpenAILLM(model="task-model", base_url=fault.base_url, api_key_env="OPRO_TEST_KEY", max_concurrency=8)
        try:
            with ThreadPoolExecutor(8) as pool:
                texts = list(pool.map(lambda i: backend.generate((Message("user", f"q{i}"),), OPTS).text, range(64)))
        finally:
            backend.close()
        assert len(texts) == 64 and all(texts)
        assert fault.counts["task"] == 64
        assert 1 <= fault.connections <= 8, fault.connections


def test_the_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY is honoured (as the SDK's client honours it): the request goes to the proxy, for
    the endpoint's absolute URL; NO_PROXY bypasses it."""
    from fault_server import FaultServer

    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with FaultServer(key=SECRET) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.removesuffix("/v1"))
        backend = OpenAILLM(model="task-model", base_url="http://llm.example.invalid:8000/v1",
                            api_key_env="OPRO_TEST_KEY", max_retries=0)
        assert backend.generate(MSGS, OPTS).text
        backend.close()
        assert proxy.paths == ["http://llm.example.invalid:8000/v1/chat/completions"]
        # Credentials in the proxy URL become its Proxy-Authorization header, never part of the URL.
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.removesuffix("/v1").replace("//", "//user:p%40ss@"))
        pool = http_pool("http://llm.example.invalid:8000/v1", timeout_s=5, size=2)
        assert pool.proxy_headers == {"proxy-authorization": "Basic dXNlcjpwQHNz"}  # user:p@ss
        assert "p%40ss" not in str(pool.proxy.url) and "user" not in str(pool.proxy.url)
        monkeypatch.setenv("NO_PROXY", "llm.example.invalid")
        bypass = OpenAILLM(model="task-model", base_url="http://llm.example.invalid:8000/v1",
                           api_key_env="OPRO_TEST_KEY", max_retries=0)
        with pytest.raises(LLMConnectionError):
            bypass.generate(MSGS, OPTS)  # straight to a host that does not exist
        assert len(proxy.paths) == 1


def test_the_transport_speaks_the_installed_sdks_http_library() -> None:
    # openai 3 moved from httpx to httpx2: the errors the sync transport raises carry that library's
    # Request and Response (what the SDK's own exceptions declare), and https uses its TLS trust.
    import ssl
    import types

    import openai._exceptions

    http = _sdk_http()
    imported = {v.__name__ for v in vars(openai._exceptions).values() if isinstance(v, types.ModuleType)}
    assert http.__name__ in imported and not ({"httpx", "httpx2"} - {http.__name__}) & imported, imported
    pool = http_pool("https://llm.example.invalid/v1", timeout_s=5, size=2)
    context = pool.connection_pool_kw["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_key_never_exposed(server: FakeServer, llm: OpenAILLM) -> None:
    assert SECRET not in repr(llm)
    assert SECRET not in json.dumps(llm.describe())
    assert SECRET not in llm.identity
    assert llm.identity == "openai:fake-model"  # the model, not where it is served (issue 66)
    assert llm.describe()["api_key_env"] == "OPRO_TEST_KEY"


def test_missing_key_for_remote_server_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPRO_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPRO_MISSING_KEY"):
        OpenAILLM(model="gpt-4o-mini", base_url="https://api.example.com/v1", api_key_env="OPRO_MISSING_KEY")


def test_local_server_needs_no_key(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPRO_MISSING_KEY", raising=False)
    backend = OpenAILLM(model="fake-model", base_url=server.url, api_key_env="OPRO_MISSING_KEY")
    server.script(ok("local"))
    assert backend.generate(MSGS, OPTS).text == "local"


def test_async_path_retries(server: FakeServer, llm: OpenAILLM) -> None:
    # The first async call builds the SDK's async client (imports, platform probe), which took more than
    # the fixture's 10 s retry-time budget on a loaded CI machine; the budget is not what is tested here.
    llm.policy = replace(llm.policy, max_retry_wait_s=120.0)
    server.script(error(429, "wait", {"retry-after-ms": "50"}), error(502), ok("async ok"))
    c = asyncio.run(llm.agenerate(MSGS, OPTS))
    assert c.text == "async ok" and c.prompt_tokens == 11
    assert len(server.requests) == 3
    # A second event loop gets its own client.
    server.script(error(401, "denied"))
    with pytest.raises(LLMAuthError):
        asyncio.run(llm.agenerate(MSGS, OPTS))


def test_through_chat_client(server: FakeServer, llm: OpenAILLM) -> None:
    server.script(ok("via client"))
    client = ChatClient(llm, role="judge")
    assert client.complete("hi", max_tokens=3).text == "via client"
    assert client.usage.snapshot()["judge"].prompt_tokens == 11


def test_parse_retry_after_formats() -> None:
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == pytest.approx(10, abs=1.0)
    assert parse_retry_after({"Retry-After": "garbage"}) is None
    assert parse_retry_after({}) is None


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        OpenAILLM(model="m", base_url="http://localhost:1/v1", timeout_s=0)
    with pytest.raises(ConfigError, match="max_retries"):
        OpenAILLM(model="m", base_url="http://localhost:1/v1", max_retries=-1)


def test_json_schema_off_sends_no_response_format(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Servers such as llama-cpp-python's reject response_format type json_schema with a 500; the
    # model setting json_schema = false must keep it out of the request, and the pool must pass it on.
    from opro.llm.pool import ModelPool, ModelSpec

    monkeypatch.setenv("OPRO_TEST_KEY", SECRET)
    server.script(ok('{"score": 4}'))
    with ModelPool() as pool:
        llm = pool.get(
            ModelSpec(backend="openai", model="m", base_url=server.url, api_key_env="OPRO_TEST_KEY", json_schema=False)
        )
        assert llm.supports_json_schema is False
        llm.generate(MSGS, GenerationOptions(max_tokens=5, json_schema='{"type":"object"}'))
    assert "response_format" not in server.requests[0]["json"]


def test_the_sdk_is_imported_only_to_map_an_error() -> None:
    # Importing `openai` costs about a second of start-up; the sync path posts through urllib3 and needs
    # the SDK only for its exception types. A fresh process: successful calls leave it unimported,
    # a refused key still maps to LLMAuthError through it.
    import os
    import subprocess

    from children import argv

    out = subprocess.run(argv("openai_calls", "GOOD_KEY"), capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GOOD_KEY": "k-good"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["after success: False", "auth error mapped: True"], out.stdout
