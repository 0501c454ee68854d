"""The streaming client against the in-process mock server (timing tolerances sized for 2 slow cores)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.client import ClientConfig, RequestResult, _consume_stream, completions_url, run_requests
from harness.serve.mock_server import MockConfig, MockServer

T = TypeVar("T")


@dataclass
class Req:
    index: int
    prompt: str = "hello world " * 8
    prompt_tokens: int = 24
    max_tokens: int = 4


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _run(
    cfg: MockConfig, reqs: list[Req], offsets: list[float], **kw: Any
) -> tuple[list[RequestResult], float, MockServer]:
    async with MockServer(cfg) as srv:
        results, dur = await run_requests(srv.url, "mock", reqs, offsets, **kw)
    return results, dur, srv


def test_completions_url() -> None:
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/", "http://h:1/v1/completions"):
        assert completions_url(base) == "http://h:1/v1/completions"


def test_streaming_parse_and_usage_tokens() -> None:
    cfg = MockConfig(tokens_per_chunk=3, prompt_tokens=123, token_delay_s=0.005)
    seen: list[int] = []
    results, _, srv = run(
        _run(
            cfg,
            [Req(0, max_tokens=10)],
            [0.0],
            config=ClientConfig(keep_text=True),
            progress=lambda r: seen.append(r.index),
        )
    )
    r = results[0]
    assert r.success, r.error
    assert (r.prompt_tokens, r.completion_tokens) == (123, 10)  # from usage, not from chunks
    assert len(r.chunk_times) == 4 and len(r.itl) == 3  # 3+3+3+1 tokens
    assert r.text == " x" * 10
    assert r.first_token_s == r.chunk_times[0] and r.end_s == r.chunk_times[-1]
    assert r.done_s is not None and r.done_s >= r.end_s
    assert r.tpot is not None and r.tpot > 0
    assert seen == [0]
    assert srv.seen[0].max_tokens == 10
    assert r.sent_s is not None and r.written_s is not None
    assert r.scheduled_s <= r.sent_s <= r.written_s <= r.first_token_s


def test_sends_are_never_early_and_punctual() -> None:
    offsets = [0.01 * i + 0.0037 for i in range(20)]
    results, _, _ = run(_run(MockConfig(), [Req(i, max_tokens=1) for i in range(20)], offsets))
    lags = sorted(r.sent_s - r.scheduled_s for r in results if r.sent_s is not None)
    assert len(lags) == 20 and lags[0] >= 0  # never sent before its scheduled time
    assert lags[10] < 0.005  # median; asyncio's own timers alone would give ~1 ms (loaded 2-core VM: lenient)


def test_offsets_validated() -> None:
    with pytest.raises(ValueError, match="offsets"):
        run(run_requests("http://127.0.0.1:1", "m", [Req(0)], [-1.0]))
    with pytest.raises(ValueError, match="offsets"):
        run(run_requests("http://127.0.0.1:1", "m", [Req(0)], [0.0, 1.0]))


def test_cancelled_run_leaves_no_dispatcher_thread() -> None:
    async def scenario() -> None:
        async with MockServer(MockConfig(ttft_s=5.0)) as srv:
            task = asyncio.create_task(run_requests(srv.url, "m", [Req(0), Req(1)], [0.0, 10.0]))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(scenario())
    assert not [t for t in threading.enumerate() if t.name == "request-dispatcher"]


def test_empty_deltas_still_count_as_token_chunks() -> None:
    results, _, _ = run(
        _run(
            MockConfig(text_per_token=""), [Req(0, max_tokens=5)], [0.0], config=ClientConfig(keep_text=True)
        )
    )
    r = results[0]
    assert r.success and r.text == ""
    assert len(r.chunk_times) == 5 and r.completion_tokens == 5


def test_ttft_is_measured_from_scheduled_time() -> None:
    results, _, _ = run(_run(MockConfig(ttft_s=0.1), [Req(0)], [0.2]))
    r = results[0]
    assert r.success
    assert r.sent_s is not None and 0.2 <= r.sent_s < 0.26
    assert r.ttft is not None and 0.09 < r.ttft < 0.2


def test_closed_loop_queueing_counts_in_ttft() -> None:
    cfg = MockConfig(ttft_s=0.1, token_delay_s=0.02)
    reqs = [Req(0, max_tokens=5), Req(1, max_tokens=5)]
    results, _, srv = run(_run(cfg, reqs, [0.0, 0.0], max_concurrency=1))
    r0, r1 = results
    assert r0.success and r1.success
    assert srv.max_in_flight == 1
    assert r0.e2el is not None and r1.ttft is not None and r1.queue_s is not None
    assert r1.queue_s >= r0.e2el - 0.01  # waited for request 0 to finish
    assert r1.ttft >= r0.e2el + 0.09  # its wait is part of its TTFT
    assert r1.ttft - r1.queue_s == pytest.approx(0.1, abs=0.08)


def test_open_loop_requests_are_not_serialized() -> None:
    reqs = [Req(i, max_tokens=2) for i in range(8)]
    results, dur, srv = run(_run(MockConfig(ttft_s=0.4), reqs, [0.0] * 8))
    assert all(r.success for r in results)
    assert srv.max_in_flight == 8
    assert all(r.sent_s is not None and r.sent_s < 0.15 for r in results)
    assert dur < 1.2  # serialized would take >= 3.2 s


def test_open_loop_sends_on_schedule_while_others_are_in_flight() -> None:
    offsets = [0.0, 0.1, 0.2]
    results, _, _ = run(_run(MockConfig(ttft_s=0.5), [Req(i) for i in range(3)], offsets))
    for r, off in zip(results, offsets, strict=True):
        assert r.success and r.sent_s is not None
        assert off <= r.sent_s < off + 0.06


def test_failure_reasons_are_recorded_and_do_not_abort_the_run() -> None:
    cfg = MockConfig(
        fail_for=lambda n, body: {1: "http500", 3: "close_mid_stream", 4: "no_usage", 5: "error_event"}.get(
            n
        ),
        token_delay_s=0.005,
    )
    reqs = [Req(i, max_tokens=6) for i in range(6)]
    results, _, _ = run(_run(cfg, reqs, [0.0] * 6, max_concurrency=1))
    kinds = [r.error_kind for r in results]
    assert [r.success for r in results] == [True, False, True, False, False, False]
    assert kinds == ["", "http_500", "", "disconnect", "missing_usage", "stream_error"]
    assert "HTTP 500" in results[1].error and "internal error" in results[1].error
    assert "mid-stream" in results[3].error
    assert "mock engine failure" in results[5].error


def test_timeout() -> None:
    t = time.perf_counter()
    results, _, _ = run(_run(MockConfig(fail="hang"), [Req(0)], [0.0], timeout_s=0.3))
    assert results[0].error_kind == "timeout" and "0.3 s" in results[0].error
    assert time.perf_counter() - t < 2.0


def test_nothing_listening_fails_fast_with_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    url = f"http://127.0.0.1:{port}"
    results, _ = run(run_requests(url, "m", [Req(0), Req(1)], [0.0, 0.0], timeout_s=30))
    assert all(r.error_kind == "connection" for r in results)
    assert "Cannot connect" in results[0].error
    assert time.perf_counter() - t < 2.0


def test_server_dying_mid_run_fails_every_outstanding_request_quickly() -> None:
    async def scenario() -> tuple[list[RequestResult], float]:
        srv = await MockServer(MockConfig(ttft_s=0.05, token_delay_s=0.05)).start()

        async def kill() -> None:
            await asyncio.sleep(0.4)
            await srv.stop()

        killer = asyncio.create_task(kill())
        reqs = [Req(i, max_tokens=200) for i in range(6)]  # 10 s each if the server lived
        results, dur = await run_requests(srv.url, "m", reqs, [0, 0, 0, 0, 0.7, 0.8], timeout_s=60)
        await killer
        return results, dur

    results, dur = run(scenario())
    assert dur < 2.0
    assert [r.error_kind for r in results] == ["disconnect"] * 4 + ["connection"] * 2
    assert all("mid-stream" in r.error for r in results[:4])


def test_one_megabyte_prompt() -> None:
    prompt = "a" * (1 << 20)
    results, _, srv = run(_run(MockConfig(), [Req(0, prompt=prompt, prompt_tokens=1 << 18)], [0.0]))
    assert results[0].success, results[0].error
    assert srv.seen[0].prompt_chars == 1 << 20
    assert results[0].prompt_tokens == 1 << 18


def test_request_body() -> None:
    captured: list[dict[str, Any]] = []

    def grab(n: int, body: dict[str, Any]) -> None:
        captured.append(body)

    cfg = ClientConfig(temperature=0.5, extra_body={"seed": 7})
    results, _, _ = run(_run(MockConfig(fail_for=grab), [Req(0, max_tokens=3)], [0.0], config=cfg))
    assert results[0].success
    body = captured[0]
    assert body["model"] == "mock" and body["max_tokens"] == 3 and body["ignore_eos"] is True
    assert body["temperature"] == 0.5 and body["seed"] == 7
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_non_sse_response_is_a_protocol_error() -> None:
    res = RequestResult(index=0, scheduled_s=0.0)
    with pytest.raises(Exception, match="not an SSE stream"):
        run(_consume_stream(_FakeResponse([b'{"choices": [{"text": "hi"}]}']), res, 0.0, False))  # type: ignore[arg-type]


class _FakeContent:
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def iter_any(self) -> AsyncIterator[bytes]:
        for p in self.parts:
            yield p


class _FakeResponse:
    def __init__(self, parts: list[bytes]) -> None:
        self.content = _FakeContent(parts)


def _sse(crlf: bool) -> bytes:
    nl = "\r\n" if crlf else "\n"
    events = [
        ": keep-alive",
        "data: " + json.dumps({"choices": [{"index": 0, "text": "héllo"}]}),
        "data: " + json.dumps({"choices": [{"index": 0, "text": ""}]}),
        "data: " + json.dumps({"choices": [{"index": 0, "text": " wörld"}]}),
        "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
        "data: [DONE]",
    ]
    return "".join(e + nl + nl for e in events).encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_sse_parse_is_independent_of_read_boundaries(cuts: list[int], crlf: bool) -> None:
    raw = _sse(crlf)
    points = sorted({min(c, len(raw)) for c in cuts})
    parts = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    res = RequestResult(index=0, scheduled_s=0.0)
    run(_consume_stream(_FakeResponse(parts), res, 0.0, keep_text=True))  # type: ignore[arg-type]
    assert res.text == "héllo wörld"
    assert len(res.chunk_times) == 3
    assert (res.prompt_tokens, res.completion_tokens) == (9, 4)


def test_events_in_one_read_are_one_itl_gap() -> None:
    """Two token events delivered by one network read share an arrival time and count as one ITL gap."""

    def ev(text: str) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"

    usage_event = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    usage = b"data: " + json.dumps(usage_event).encode()
    parts = [ev("a"), ev("b") + ev("c"), ev("d") + usage + b"\n\ndata: [DONE]\n\n"]
    res = RequestResult(index=0, scheduled_s=0.0)
    run(_consume_stream(_FakeResponse(parts), res, 0.0, keep_text=False))  # type: ignore[arg-type]
    assert len(res.chunk_times) == 4 and res.chunk_times[1] == res.chunk_times[2]
    assert len(res.itl) == 2 and all(g > 0 for g in res.itl)
    assert sum(res.itl) == pytest.approx(res.chunk_times[-1] - res.chunk_times[0])


def test_client_drops_idle_connections_before_vllms_server_does() -> None:
    """vLLM's server closes idle connections after VLLM_HTTP_TIMEOUT_KEEP_ALIVE; a client that reuses one
    at that moment loses the request. Ours must give up an idle connection sooner."""
    import vllm.envs

    from harness.client import CLIENT_KEEPALIVE_S

    assert 0 < CLIENT_KEEPALIVE_S <= vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE / 2


def test_an_idle_connection_is_reused_soon_and_not_after_the_keepalive() -> None:
    from harness.client import CLIENT_KEEPALIVE_S, make_session

    async def scenario() -> list[int]:
        opened: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            opened.append(1)
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:  # HTTP/1.1 keep-alive: answer every request on this connection until it closes
                    await reader.readuntil(b"\r\n\r\n")
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        seen = []
        async with server, make_session() as session:
            for pause in (0.0, 0.2, CLIENT_KEEPALIVE_S + 0.5):
                await asyncio.sleep(pause)
                async with session.get(url) as r:
                    assert await r.read() == b"ok"
                seen.append(len(opened))
        return seen

    assert asyncio.run(scenario()) == [1, 1, 2]
