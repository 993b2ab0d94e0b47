"""Backend ``openai``: any OpenAI-compatible chat-completions endpoint through the ``openai`` SDK.

The SDK's own retries are off (``max_retries=0``); :class:`RetryPolicy` retries 429 / 5xx /
timeouts / connection errors with exponential backoff and full jitter, honours ``Retry-After``,
and stops after ``max_retries`` retries or ``max_retry_wait_s`` seconds in all. 400 / 401 / 403 /
404 / 422 fail at once with :class:`LLMAuthError` / :class:`LLMBadRequestError`.

The API key is read from the environment variable named by ``api_key_env`` when the backend is
built; it never appears in :meth:`describe`, :attr:`identity`, ``repr`` or error messages.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import importlib
import importlib.metadata
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlparse

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
from opro.llm.client import LLM, Completion, GenerationOptions, Message
from opro.redaction import redact_text, redact_url

if TYPE_CHECKING:
    import openai

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
# Servers such as llama.cpp's or vLLM's accept any key; the SDK insists on a non-empty one.
_NO_KEY = "no-key-needed"
#: A retry wait at least this long is announced (a warning): shorter backoffs are routine.
LOUD_WAIT_S = 5.0

logger = logging.getLogger(__name__)


def _is_local(base_url: str) -> bool:
    host = (urlparse(base_url).hostname or "").lower()
    return host in _LOCAL_HOSTS or host.endswith(".localhost")


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date) or OpenAI's ``retry-after-ms``."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in count and total time."""

    max_retries: int = 5
    max_retry_wait_s: float = 120.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    #: A server's Retry-After longer than this is capped (then retried), never obeyed blindly.
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_retry_wait_s < 0:
            raise ConfigError(f"max_retry_wait_s must be >= 0, got {self.max_retry_wait_s}")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise ConfigError("backoff_base_s and backoff_max_s must be >= 0")

    def delay(self, retry: int, error: LLMError, rng: random.Random) -> float:
        """Wait before retry number ``retry`` (0-based): the server's Retry-After wins when given."""
        if isinstance(error, LLMRateLimitError) and error.retry_after is not None:
            return min(error.retry_after, self.max_retry_after_s)
        return rng.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * (2**retry)))

    def next_wait(self, retry: int, error: LLMError, started: float, rng: random.Random) -> float | None:
        """Seconds to sleep before retrying, or None to give up."""
        if not is_retryable(error) or retry >= self.max_retries:
            return None
        wait = self.delay(retry, error, rng)
        left = self.max_retry_wait_s - (time.monotonic() - started)
        if left <= 0:
            return None
        # Wait what the time budget still allows, then try once more: failing visibly beats waiting forever.
        return min(wait, left)


def is_retryable(error: LLMError) -> bool:
    return isinstance(error, LLMRateLimitError | LLMServerError | LLMTimeoutError | LLMConnectionError)


class OpenAILLM(LLM):
    """Chat completions from an OpenAI-compatible server."""

    provider = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 5,
        max_retry_wait_s: float = 120.0,
        max_concurrency: int = 8,
        json_schema: bool = True,
        extra_headers: Mapping[str, str] | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        logprobs: bool = True,
        seed: int | None = None,
    ) -> None:
        if not model:
            raise ConfigError("OpenAILLM needs a model name (for example model='gpt-4o-mini').")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self._model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_concurrency = max_concurrency
        self.supports_json_schema = json_schema
        self.supports_logprobs = logprobs
        self.policy = RetryPolicy(
            max_retries=max_retries,
            max_retry_wait_s=max_retry_wait_s,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
        )
        self._extra_headers = dict(extra_headers or {})
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._api_key = self._read_key()  # kept private; never logged
        # The sync path posts the JSON itself through one urllib3 pool: the SDK's request building
        # and pydantic models cost about 2 ms of CPU per call, and its transport, httpx, about 1 ms
        # more; a shared httpx client also scans every connection and waiting request under one lock
        # per request, so at 128 in flight it spent 10 ms of CPU per request and topped out near 100
        # requests a second (experiments/bench_throughput.py). urllib3's pool keeps the idle
        # connections on a stack and holds its lock only to take or return one. The SDK still maps
        # the errors (see :meth:`_post`), and is imported only then or for the async path (1 s of
        # start-up).
        url_args = client_url_args(self.base_url)
        self._url = url_args["base_url"].rstrip("/") + "/chat/completions"
        query = url_args.get("default_query")
        self._post_url = self._url + ("?" + urlencode(query) if query else "")
        self._headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            **self._extra_headers,
        }
        self._http = http_pool(self._url, timeout_s=self.timeout_s, size=max_concurrency)
        # One async client per event loop: httpx async pools must not cross loops.
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    def _read_key(self) -> str:
        key = os.environ.get(self.api_key_env, "")
        if key:
            return key
        if _is_local(self.base_url):
            return _NO_KEY
        raise ConfigError(
            f"the openai backend for {self.base_url} needs an API key: set the environment variable "
            f"{self.api_key_env} (or name another one with api_key_env)."
        )

    # -- identity ------------------------------------------------------------------------------

    @property
    def model(self) -> str:
        return self._model

    @property
    def identity(self) -> str:
        """The model and what shapes its replies beyond a call's options, never where it is served: the
        same model on another port or host answers from the call cache, as the decision ledger takes it
        for the same model (a server that serves another model under this name shares its answers)."""
        shaped = ("" if self.supports_json_schema else ":no-json-schema") + ("" if self.supports_logprobs else ":no-logprobs")
        return f"openai:{self._model}{shaped}"

    def describe(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "model": self._model,
            "base_url": redact_url(self.base_url),
            "api_key_env": self.api_key_env,
            "timeout_s": str(self.timeout_s),
            "max_retries": str(self.policy.max_retries),
        }

    def __repr__(self) -> str:
        return f"OpenAILLM(model={self._model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    # -- requests ------------------------------------------------------------------------------

    def _request(self, messages: tuple[Message, ...], options: GenerationOptions) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "timeout": self.timeout_s,
        }
        if options.seed is not None:
            kwargs["seed"] = options.seed
        if options.stop:
            kwargs["stop"] = list(options.stop)
        schema = options.schema()
        if schema is not None and self.supports_json_schema:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema, "strict": False},
            }
        if options.top_logprobs and self.supports_logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = options.top_logprobs
        return kwargs

    def _completion(self, response: Any, latency: float) -> Completion:
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise LLMServerError(
                f"the server at {redact_url(self.base_url)} returned no choices", model=self._model, provider=self.provider
            )
        choice = choices[0]
        text = choice.message.content or ""
        top: tuple[dict[str, float], ...] | None = None
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if content:
            top = tuple({alt.token: float(alt.logprob) for alt in (tok.top_logprobs or [])} for tok in content)
        usage = getattr(response, "usage", None)
        return Completion(
            text=text,
            model=getattr(response, "model", None) or self._model,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            latency_s=latency,
            top_logprobs=top,
            finish_reason=choice.finish_reason,
        )

    def _completion_from_json(self, data: Any, latency: float) -> Completion:
        """:meth:`_completion` for the decoded JSON body of a reply (the sync path)."""
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise LLMServerError(
                f"the server at {redact_url(self.base_url)} returned no choices", model=self._model, provider=self.provider
            )
        choice = choices[0]
        text = (choice.get("message") or {}).get("content") or ""
        top: tuple[dict[str, float], ...] | None = None
        content = (choice.get("logprobs") or {}).get("content")
        if content:
            top = tuple(
                {alt["token"]: float(alt["logprob"]) for alt in (tok.get("top_logprobs") or [])} for tok in content
            )
        usage = data.get("usage") or {}
        return Completion(
            text=str(text),
            model=data.get("model") or self._model,
            prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
            completion_tokens=int(usage.get("completion_tokens", 0) or 0),
            latency_s=latency,
            top_logprobs=top,
            finish_reason=choice.get("finish_reason"),
        )

    def _post(self, body: bytes) -> Any:
        """POST one request; errors are raised as the SDK's exceptions, so one mapping serves both paths."""
        import urllib3

        try:
            response = self._http.request("POST", self._post_url, body=body, headers=self._headers)
        except urllib3.exceptions.HTTPError as exc:
            raise _transport_error(exc, "POST", self._url) from exc
        if response.status >= 400:
            import openai

            http = _sdk_http()
            reply = http.Response(
                response.status, headers=list(response.headers.items()), content=response.data,
                request=http.Request("POST", self._url),
            )
            try:
                err_body: Any = reply.json()
            except ValueError:
                err_body = reply.text or None
            raise openai.APIStatusError(f"Error code: {response.status} - {err_body}", response=reply, body=err_body)
        return json.loads(response.data)

    def reach(self, *, timeout_s: float = 10.0) -> LLMError | None:
        """Whether the server can be reached, by one GET of its model list (``/models``: no tokens, no
        answer paid for) through the calls' own connection pool, proxy and TLS: None when it answered,
        whatever the status (a gateway without that route was still reached; a bad key or model is the
        first call's to say), else the error a call would raise (``cannot reach URL: ...``), not retried."""
        import urllib3

        url = self.models_url
        try:
            self._http.request("GET", url, headers=self._headers,
                               timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s))
        except urllib3.exceptions.HTTPError as exc:
            # The error names the URL without its query, where a key may sit.
            transport = _transport_error(exc, "GET", url.partition("?")[0])
            return convert_openai_error(transport, model=self._model, provider=self.provider, base_url=self.base_url,
                                        timeout_s=timeout_s, api_key_env=self.api_key_env)
        return None

    @property
    def models_url(self) -> str:
        """The server's model list, what :meth:`reach` asks (with the base URL's query: secrets there, so
        shown only through :func:`opro.redaction.redact_url`)."""
        query = self._post_url.partition("?")[2]
        return self._url.removesuffix("/chat/completions") + "/models" + ("?" + query if query else "")

    def convert_error(self, exc: BaseException) -> LLMError:
        """Map an ``openai`` SDK exception to the opro error tree (with model, provider, status)."""
        return convert_openai_error(
            exc,
            model=self._model,
            provider=self.provider,
            base_url=self.base_url,
            timeout_s=self.timeout_s,
            api_key_env=self.api_key_env,
        )

    def _give_up(self, error: LLMError, attempts: int) -> LLMError:
        if attempts <= 1 or not is_retryable(error):
            return error
        cls: Callable[..., LLMError] = type(error)
        kwargs: dict[str, Any] = {"model": error.model, "provider": error.provider, "status": error.status}
        if isinstance(error, LLMRateLimitError):
            kwargs["retry_after"] = error.retry_after
        return cls(f"{error.detail} (gave up after {attempts} attempts)", **kwargs)

    def _wait(self, retry: int, error: LLMError, started: float) -> float | None:
        with self._rng_lock:
            wait = self.policy.next_wait(retry, error, started, self._rng)
        if wait is not None and wait >= LOUD_WAIT_S:
            # A server's Retry-After can hold a call for a minute: say so, or the run looks hung.
            why = "as the server's Retry-After asks" if getattr(error, "retry_after", None) is not None else "backing off"
            logger.warning("%s: waiting %.0f s before retry %d of %d (%s)",
                           redact_text(error.detail), wait, retry + 1, self.policy.max_retries, why)
        return wait

    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        kwargs = self._request(messages, options)
        del kwargs["timeout"]  # the pool's
        body = json.dumps(kwargs, ensure_ascii=False).encode("utf-8")
        started = time.monotonic()
        retry = 0
        while True:
            t0 = time.perf_counter()
            try:
                # Parsing is inside the loop: an empty or malformed reply is retried like a 5xx.
                return self._completion_from_json(self._post(body), time.perf_counter() - t0)
            except Exception as exc:
                error = self.convert_error(exc)
                wait = self._wait(retry, error, started)
                if wait is None:
                    raise self._give_up(error, retry + 1) from exc
                time.sleep(wait)
                retry += 1

    def _async_client(self) -> openai.AsyncOpenAI:
        import openai

        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                api_key=self._api_key,
                max_retries=0,
                timeout=self.timeout_s,
                default_headers=self._extra_headers or None,
                **client_url_args(self.base_url),
            )
            self._async_clients[loop] = client
        return client

    async def agenerate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        kwargs = self._request(messages, options)
        client = self._async_client()
        started = time.monotonic()
        retry = 0
        while True:
            t0 = time.perf_counter()
            try:
                return self._completion(await client.chat.completions.create(**kwargs), time.perf_counter() - t0)
            except Exception as exc:
                error = self.convert_error(exc)
                wait = self._wait(retry, error, started)
                if wait is None:
                    raise self._give_up(error, retry + 1) from exc
                await asyncio.sleep(wait)
                retry += 1

    def close(self) -> None:
        self._http.clear()
        # Async clients are closed with their loops; dropping references is enough here.
        self._async_clients.clear()


def _transport_error(exc: Exception, method: str, url: str) -> Exception:
    """A urllib3 failure to connect or read as the SDK's exception (:func:`convert_openai_error` maps it)."""
    import openai
    import urllib3

    # A failed connect comes wrapped (MaxRetryError, whose text holds the URL and its query).
    cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    request = _sdk_http().Request(method, url)
    # urllib3 counts a refused connection as a timeout (NewConnectionError subclasses it).
    refused = isinstance(cause, urllib3.exceptions.NewConnectionError)
    if isinstance(cause, urllib3.exceptions.TimeoutError) and not refused:
        return openai.APITimeoutError(request=request)
    return openai.APIConnectionError(message=redact_text(str(cause)), request=request)


@functools.cache  # the installed SDK does not change while the process runs
def _sdk_http() -> Any:
    """The HTTP library the installed ``openai`` SDK is built on: httpx up to openai 2, httpx2 from
    openai 3. Its exceptions take that library's ``Request`` and ``Response``, and its client that
    library's TLS trust, which the urllib3 transport copies. Read from the installed version, not by
    importing the SDK (a second of start-up that the sync path spares)."""
    major = int(importlib.metadata.version("openai").split(".", 1)[0])
    return importlib.import_module("httpx2" if major >= 3 else "httpx")


def http_pool(url: str, *, timeout_s: float, size: int) -> Any:
    """A urllib3 pool for ``url``'s server: ``size`` kept-alive connections (more are opened and
    dropped when more calls run at once), no retries of its own (:class:`RetryPolicy` decides), the
    proxy from the environment (``HTTPS_PROXY``, ``NO_PROXY``...) and the TLS trust of the SDK's own
    HTTP library (:func:`_sdk_http`: its certificates, ``SSL_CERT_FILE``), as the SDK's client would."""
    import urllib.request
    from urllib.parse import unquote, urlsplit

    import urllib3

    parts = urlsplit(url)
    options: dict[str, Any] = {
        "num_pools": 4, "maxsize": max(1, size), "block": False,
        # Redirects followed (as the SDK's client does), nothing retried: RetryPolicy decides.
        "retries": urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5),
        "timeout": urllib3.Timeout(connect=timeout_s, read=timeout_s),
    }
    if parts.scheme == "https":
        options["ssl_context"] = _sdk_http().create_ssl_context()
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        # Credentials in the proxy URL go in a Proxy-Authorization header (urllib3 leaves them unused).
        via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        headers = None
        if via.username is not None:
            auth = f"{unquote(via.username)}:{unquote(via.password or '')}"
            headers = urllib3.make_headers(proxy_basic_auth=auth)
            via = via._replace(netloc=via.netloc.rpartition("@")[2])
        return urllib3.ProxyManager(via.geturl(), proxy_headers=headers, **options)
    return urllib3.PoolManager(**options)


def client_url_args(base_url: str) -> dict[str, Any]:
    """``base_url`` for the openai SDK, with a query (``?api-key=...``, as some proxies and Azure
    gateways take the key) passed as ``default_query``: the SDK appends the route after the whole
    base URL, which would put ``/chat/completions`` inside the query."""
    from urllib.parse import parse_qsl, urlsplit, urlunsplit

    parts = urlsplit(base_url)
    if not parts.query:
        return {"base_url": base_url}
    return {
        "base_url": urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")),
        "default_query": dict(parse_qsl(parts.query, keep_blank_values=True)),
    }


def convert_openai_error(
    exc: BaseException, *, model: str, provider: str, base_url: str, timeout_s: float, api_key_env: str
) -> LLMError:
    """Map an ``openai`` SDK exception to the opro error tree (chat and embeddings clients alike)."""
    import openai

    where: dict[str, Any] = {"model": model, "provider": provider}
    if isinstance(exc, LLMError):
        return exc
    base_url = redact_url(base_url)
    if isinstance(exc, openai.APITimeoutError):
        return LLMTimeoutError(f"request to {base_url} timed out after {timeout_s:g} s", **where)
    if isinstance(exc, openai.APIConnectionError):
        return LLMConnectionError(f"cannot reach {base_url}: {redact_text(str(exc))}", **where)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _error_detail(exc)
        if status == 429:
            retry_after = parse_retry_after(exc.response.headers)
            return LLMRateLimitError(
                f"rate limited (429) by {base_url}: {detail}", retry_after=retry_after, status=status, **where
            )
        if status in (401, 403):
            return LLMAuthError(
                f"authentication failed ({status}) at {base_url}: {detail}; check the key in the environment "
                f"variable {api_key_env}", status=status, **where
            )
        if status == 408:
            return LLMTimeoutError(f"server timed out (408) at {base_url}: {detail}", status=status, **where)
        if status == 409 or status >= 500:
            return LLMServerError(f"server error ({status}) at {base_url}: {detail}", status=status, **where)
        if status == 404:
            return LLMBadRequestError(
                f"not found (404) at {base_url}: {detail}; check the model name and the base_url (it usually ends in /v1)",
                status=status, **where,
            )
        return LLMBadRequestError(f"request rejected ({status}) by {base_url}: {detail}", status=status, **where)
    if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError):
        return LLMServerError(f"unreadable response from {base_url}: {exc}", **where)
    if isinstance(exc, openai.OpenAIError):
        return LLMBadRequestError(f"openai client error: {exc}", **where)
    return LLMError(f"unexpected error: {type(exc).__name__}: {exc}", **where)


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return redact_text(str(err["message"])[:500])
    return redact_text(str(getattr(exc, "message", exc))[:500])


__all__ = ["DEFAULT_BASE_URL", "OpenAILLM", "RetryPolicy", "is_retryable", "parse_retry_after"]
