"""Async streaming client for vLLM's OpenAI-compatible ``/v1/completions``.

Timing model (all times are seconds relative to one run start ``t0 = time.perf_counter()``):

* ``scheduled_s``: when the request was SUPPOSED to be sent (its arrival offset).
* ``sent_s``: when the client handed it to aiohttp (after waiting for a concurrency slot, if any);
  ``written_s``: when aiohttp had passed the whole body to the socket's transport.
  Request bodies are JSON-encoded before ``t0`` (a 512 KB prompt costs ~1 ms to encode), so the
  encoding is never on the latency path. Memory cost: one encoded copy of every prompt.
* ``chunk_times``: arrival time of each token-bearing SSE event (see below), taken when the network
  read that delivered it returned, before parsing, so parse cost does not inflate the timestamps.
* ``first_token_s`` = ``chunk_times[0]``; ``end_s`` = ``chunk_times[-1]`` (as ``vllm bench serve``'s
  ``latency``); ``done_s``: when ``data: [DONE]`` arrived.

Dispatch: a helper thread releases each request at ``t0 + offset`` (asyncio's own timers fire up to 2 ms
late); a request is never sent before its time, and on a loaded 2-core VM the median lateness is ~0.05 ms
(``benchmarks/client_overhead.py`` measures it, with the rest of the client's overhead).

Latencies are measured from ``scheduled_s`` so client-side queueing is never hidden: ``ttft =
first_token_s - scheduled_s`` and ``e2el = end_s - scheduled_s``. In closed-loop mode the wait for a
concurrency slot is therefore part of the TTFT; ``queue_s = sent_s - scheduled_s`` reports it apart.

How chunks map to tokens: vLLM streams one SSE event per engine step that produced output for the
request. An event usually carries one token, but may carry several (speculative decoding, or the API
server coalescing several steps' outputs when it falls behind), and its ``text`` may be empty (a token
that completes no UTF-8 character, or text held back for stop-string matching). A *token-bearing chunk*
is any event with a non-empty ``choices`` list, whatever its text (the same rule as ``vllm bench
serve``). Token COUNTS come only from the server's final ``usage`` event (``stream_options.
include_usage``); a stream without it is a failure. Hence ``itl`` is per chunk, while ``tpot = (e2el -
ttft) / (completion_tokens - 1)`` is per token.

ITL, as ``vllm bench serve`` defines it: one gap per token-bearing chunk after the first, however many
tokens that chunk carries, so ``sum(itl) == end_s - first_token_s``. Several events that one network read
delivered together carry one arrival time (``chunk_times`` keeps one entry per event); they are one
delivery, so they give ONE gap from the previous delivery, never a gap of zero per extra event. (vLLM
stamps each event as it parses it, which turns the same situation into gaps of a few microseconds of parse
time.) Zero gaps would otherwise enter ITL percentiles and make a p50 ITL of 0 possible.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter
from aiohttp.payload import BytesPayload, Payload

READ_BUFSIZE = 8 * 2**20  # aiohttp's 64 KiB default makes `vllm bench serve` collapse at 50K+ contexts
ERROR_EXCERPT_CHARS = 300
START_DELAY_S = 0.005  # between execute() starting the dispatcher and the run's t0
_json_decode = json.JSONDecoder().decode  # on str: skips json.loads' encoding sniffing of bytes


class RequestLike(Protocol):
    """What the client needs from a request (``harness.workload.spec.RequestSpec`` fits)."""

    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int


@dataclass
class ClientConfig:
    """Request-body and session options shared by every request of a run."""

    temperature: float = 0.0
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    keep_text: bool = False
    read_bufsize: int = READ_BUFSIZE


@dataclass
class RequestResult:
    """One request's outcome. Times are seconds from the run start (see the module docstring)."""

    index: int
    scheduled_s: float
    sent_s: float | None = None
    written_s: float | None = None  # the whole body handed to the transport (see _JsonBody)
    first_token_s: float | None = None
    end_s: float | None = None
    done_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # from the server's usage event
    completion_tokens: int | None = None  # from the server's usage event
    expected_prompt_tokens: int | None = None  # what the workload asked for
    max_tokens: int | None = None
    success: bool = False
    error: str = ""
    error_kind: str = ""  # short category for counting: http_500, timeout, connection, disconnect, ...
    text: str | None = None

    @property
    def queue_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.scheduled_s

    @property
    def e2el(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.scheduled_s

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive deliveries of token-bearing chunks (see the module docstring)."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False) if b != a]

    @property
    def tpot(self) -> float | None:
        n, ttft, e2el = self.completion_tokens, self.ttft, self.e2el
        if n is None or n <= 1 or ttft is None or e2el is None:
            return None
        return (e2el - ttft) / (n - 1)


class _RequestFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _JsonBody(BytesPayload):
    """Pre-encoded JSON body that stamps ``res.written_s`` when aiohttp has handed it to the transport.

    That is the end of the client's work: the kernel takes what the socket buffer holds at once, and the
    transport sends the rest as the server reads (TCP flow control; a fresh loopback connection takes a
    few hundred KB at once). We then drain, as aiohttp would. Skips BytesPayload's >1 MB warning: the
    body goes to the transport in one call, without blocking the loop."""

    def __init__(self, value: bytes, res: RequestResult, t0: float) -> None:
        Payload.__init__(self, value, content_type="application/json")
        self._size = len(value)
        self._res, self._t0 = res, t0

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        chunk = self._value if content_length is None else self._value[:content_length]
        if isinstance(writer, StreamWriter):
            await writer.write(chunk, drain=False)
            self._res.written_s = time.perf_counter() - self._t0
            await writer.drain()
        else:  # pragma: no cover - aiohttp always passes its StreamWriter
            await writer.write(chunk)
            self._res.written_s = time.perf_counter() - self._t0

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)


def completions_url(base_url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all give ``http://h:p/v1/completions``."""
    url = base_url.rstrip("/")
    if url.endswith("/v1/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/completions"
    return url + "/v1/completions"


def encode_body(model: str, req: RequestLike, config: ClientConfig) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": config.temperature,
        "ignore_eos": config.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(config.extra_body)
    return json.dumps(body).encode()


# vLLM's HTTP server closes a connection that has been idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default);
# aiohttp keeps idle connections for 15 s. A request sent on a connection the server is closing at that moment
# fails before any byte comes back (ClientOSError, connection reset), a failure of the client, not the server:
# the short soak met it in CI when one arm's connection idled while the other arm finished. Ours go first.
CLIENT_KEEPALIVE_S = 2.0


def make_connector() -> aiohttp.TCPConnector:
    """No connection cap (total or per host); idle connections dropped before the server would drop them."""
    return aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=CLIENT_KEEPALIVE_S)


def make_session(config: ClientConfig | None = None) -> aiohttp.ClientSession:
    """A session on `make_connector` with a large read buffer.

    Per-request timeouts are passed on each request."""
    config = config or ClientConfig()
    connector = make_connector()
    return aiohttp.ClientSession(
        connector=connector,
        read_bufsize=config.read_bufsize,
        timeout=aiohttp.ClientTimeout(total=None),
        headers={"Content-Type": "application/json", **config.headers},
    )


def _excerpt(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text[:ERROR_EXCERPT_CHARS] + ("..." if len(text) > ERROR_EXCERPT_CHARS else "")


def _handle_event(event: bytes, t: float, res: RequestResult, texts: list[str] | None) -> bool:
    """Apply one SSE event to ``res``; returns True on ``data: [DONE]``."""
    if event.startswith(b"data: ") and b"\n" not in event:  # vLLM's one-line events: the fast path
        payload = event[6:]
    else:
        data_lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if not data_lines:
            return False  # comment / keep-alive / other field
        payload = b"\n".join(data_lines)
    if payload == b"[DONE]":
        return True
    try:
        obj = _json_decode(payload.decode())
    except ValueError as e:
        raise _RequestFailed("protocol", f"unparseable SSE event: {_excerpt(payload)}") from e
    if not isinstance(obj, dict):
        raise _RequestFailed("protocol", f"unexpected SSE event: {_excerpt(payload)}")
    if "error" in obj and not obj.get("choices"):
        raise _RequestFailed("stream_error", f"server error event: {_excerpt(payload)}")
    choices = obj.get("choices")
    if choices:
        res.chunk_times.append(t)
        if texts is not None:
            texts.append(choices[0].get("text") or "")
    usage = obj.get("usage")
    if usage:
        res.prompt_tokens = usage.get("prompt_tokens")
        res.completion_tokens = usage.get("completion_tokens")
    return False


async def _consume_stream(
    resp: aiohttp.ClientResponse, res: RequestResult, t0: float, keep_text: bool
) -> None:
    texts: list[str] | None = [] if keep_text else None
    buf = b""
    done = False
    perf = time.perf_counter
    async for data in resp.content.iter_any():
        t = perf() - t0
        buf += data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            continue
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if _handle_event(event, t, res, texts):
                done = True
                res.done_s = t
    if texts is not None:
        res.text = "".join(texts)
    if not done and not res.chunk_times and buf.strip():
        raise _RequestFailed("protocol", f"response is not an SSE stream: {_excerpt(buf)}")
    if not done:
        where = f"after {len(res.chunk_times)} token chunks" if res.chunk_times else "before any token"
        raise _RequestFailed("disconnect", f"server closed the stream {where} without data: [DONE]")
    if res.completion_tokens is None or res.prompt_tokens is None:
        raise _RequestFailed("missing_usage", "stream had no usage event (stream_options.include_usage)")
    if not res.chunk_times:
        raise _RequestFailed("no_tokens", "stream finished without a token-bearing chunk")


def _classify(e: BaseException, timeout_s: float, res: RequestResult) -> tuple[str, str]:
    name = type(e).__name__
    if isinstance(e, _RequestFailed):
        return e.kind, str(e)
    if isinstance(e, TimeoutError):  # includes aiohttp's ServerTimeoutError
        return "timeout", f"timeout: no complete response within {timeout_s:g} s ({name})"
    if isinstance(e, aiohttp.ClientConnectorError):
        return "connection", f"connection error: {e}"
    if isinstance(e, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        where = "mid-stream" if res.chunk_times else "before any token"
        return "disconnect", f"server disconnected {where}: {name}: {e}"
    if isinstance(e, aiohttp.ClientConnectionError | ConnectionError):
        return "connection", f"connection error: {name}: {e}"
    if isinstance(e, aiohttp.ClientError):
        return "client", f"client error: {name}: {e}"
    return "internal", f"unexpected client-side error: {name}: {e}"


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    res: RequestResult,
    t0: float,
    timeout: aiohttp.ClientTimeout,
    keep_text: bool = False,
) -> RequestResult:
    """Send one pre-encoded request and fill ``res``. Never raises (except on cancellation)."""
    res.sent_s = time.perf_counter() - t0
    try:
        async with session.post(url, data=_JsonBody(body, res, t0), timeout=timeout) as resp:
            if resp.status != 200:
                raw = await resp.content.read(4096)
                raise _RequestFailed(f"http_{resp.status}", f"HTTP {resp.status}: {_excerpt(raw)}")
            await _consume_stream(resp, res, t0, keep_text)
    except Exception as e:  # a failed request never aborts the run
        res.error_kind, res.error = _classify(e, timeout.total or 0.0, res)
        return res
    res.first_token_s = res.chunk_times[0]
    res.end_s = res.chunk_times[-1]
    res.success = True
    return res


class _Dispatcher:
    """Releases requests to the event loop at their scheduled times, from a thread.

    asyncio's own timers wake up to 2 ms late (epoll's 1 ms resolution, rounded up once by ``selectors``
    and again by ``select.epoll``). Instead a thread waits with ``threading.Event.wait`` (sub-ms) and hands
    the due indices to the loop with ``call_soon_threadsafe``, which wakes it at once. That hand-off, and
    the new task's first step, take two thread wake-ups and a loop iteration (~0.1-0.3 ms), so the thread
    aims ``lead`` early: the median of the last 15 measured latencies from aimed wake-up to task start
    (``observe``), at most 0.5 ms. Each task then yields to the loop until its exact time
    (``wait_until``), so a request is never sent early. If the loop is busy in Python the thread waits for
    the GIL (at most ``sys.getswitchinterval()``)."""

    MAX_LEAD_S = 0.0005

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        t0: float,
        schedule: list[tuple[float, int]],
        release: Callable[[list[int], float], None],
    ) -> None:
        self._loop, self._t0, self._schedule, self._release = loop, t0, schedule, release
        self._lead = 0.0
        self._latencies: deque[float] = deque(maxlen=15)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-dispatcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        k, n = 0, len(self._schedule)
        while k < n:
            fire_at = self._t0 + self._schedule[k][0] - self._lead
            now = time.perf_counter()
            if fire_at > now:
                if self._stop.wait(fire_at - now):
                    return
                now = time.perf_counter()
                if now < fire_at:
                    continue
            else:
                fire_at = now
            due_by = now - self._t0 + self._lead
            due = []
            while k < n and self._schedule[k][0] <= due_by:
                due.append(self._schedule[k][1])
                k += 1
            if self._stop.is_set():
                return
            self._loop.call_soon_threadsafe(self._release, due, fire_at)

    def observe(self, latency: float) -> None:
        """Latency from an aimed wake-up to the first released task running (called on the loop)."""
        self._latencies.append(latency)
        self._lead = min(self.MAX_LEAD_S, statistics.median(self._latencies))

    @staticmethod
    async def wait_until(when: float) -> None:
        while time.perf_counter() < when:
            await asyncio.sleep(0)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class PreparedRun:
    """Requests with their bodies already JSON-encoded (done before the run clock starts)."""

    bodies: list[bytes]
    results: list[RequestResult]
    t0: float | None = None  # the run start (time.perf_counter()), set by execute()


def prepare(
    model: str, requests: Sequence[RequestLike], offsets: Sequence[float], config: ClientConfig | None = None
) -> PreparedRun:
    if len(offsets) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(offsets)} offsets")
    if not all(math.isfinite(off) and off >= 0 for off in offsets):
        raise ValueError("offsets must be finite and >= 0 (seconds from the run start)")
    config = config or ClientConfig()
    results = [
        RequestResult(
            index=r.index,
            scheduled_s=float(off),
            expected_prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens,
        )
        for r, off in zip(requests, offsets, strict=True)
    ]
    return PreparedRun([encode_body(model, r, config) for r in requests], results)


async def execute(
    base_url: str,
    run: PreparedRun,
    *,
    max_concurrency: int | None = None,
    timeout_s: float = 3600.0,
    progress: Callable[[RequestResult], None] | None = None,
    config: ClientConfig | None = None,
) -> tuple[list[RequestResult], float]:
    """The timed part of run_requests (which see); consumes ``run.bodies``."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1 or None")
    config = config or ClientConfig()
    url = completions_url(base_url)
    bodies, results = run.bodies, run.results
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async with make_session(config) as session:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        all_released: asyncio.Future[None] = loop.create_future()

        async def one(i: int, fire_at: float | None) -> None:
            res = results[i]
            if fire_at is not None:  # the first request of a release: measure the dispatch latency
                dispatcher.observe(time.perf_counter() - fire_at)
            await dispatcher.wait_until(t0 + res.scheduled_s)
            if sem is None:
                await send_one(session, url, bodies[i], res, t0, timeout, config.keep_text)
            else:
                async with sem:
                    await send_one(session, url, bodies[i], res, t0, timeout, config.keep_text)
            bodies[i] = b""
            if progress is not None:
                progress(res)

        def release(due: list[int], fire_at: float) -> None:
            if dispatcher.stopped:
                return
            tasks.extend(loop.create_task(one(i, fire_at if k == 0 else None)) for k, i in enumerate(due))
            if len(tasks) == len(results) and not all_released.done():
                all_released.set_result(None)

        order = sorted(range(len(results)), key=lambda i: results[i].scheduled_s)
        # The run starts a little after now, so the dispatcher thread is up when the first request is due.
        t0 = run.t0 = time.perf_counter() + START_DELAY_S
        dispatcher = _Dispatcher(loop, t0, [(results[i].scheduled_s, i) for i in order], release)
        try:
            if results:
                await all_released
            await asyncio.gather(*tasks)
        finally:  # normal end, a progress callback that raised, or cancellation (e.g. asyncio.wait_for)
            dispatcher.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        duration = time.perf_counter() - t0
    return results, duration


async def run_requests(
    base_url: str,
    model: str,
    requests: Sequence[RequestLike],
    offsets: Sequence[float],
    *,
    max_concurrency: int | None = None,
    timeout_s: float = 3600.0,
    progress: Callable[[RequestResult], None] | None = None,
    config: ClientConfig | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests[i]`` at ``offsets[i]`` seconds after the run start.

    Open loop (``max_concurrency=None``): each request is sent at its offset whatever is in flight.
    Closed loop: additionally at most ``max_concurrency`` requests are in flight; a request that is due
    waits for a slot (FIFO), and that wait counts in its latencies. Returns the results in request order
    and the run's wall duration (run start to the last completion). ``progress(result)`` is called as
    each request finishes. A failed request is recorded (``success=False``, ``error``, ``error_kind``);
    it never aborts the run.
    """
    run = prepare(model, requests, offsets, config)
    return await execute(
        base_url, run, max_concurrency=max_concurrency, timeout_s=timeout_s, progress=progress, config=config
    )
