"""A tiny OpenAI-compatible streaming ``/v1/completions`` server for tests and the client-overhead benchmark.

In-process use (nothing is left running after the block)::

    async with MockServer(MockConfig(ttft_s=0.1)) as srv:
        await run_requests(srv.url, "mock", ...)

Out-of-process use (the client-overhead benchmark, so the server does not share the client's event loop):
``python -m harness.serve.mock_server --port 0`` prints ``PORT <n>`` and serves until SIGTERM/SIGINT.

Streams like vLLM: ``data: {chunk}\\n\\n`` events with ``choices[0].text``, then (when
``stream_options.include_usage``) a ``choices: []`` event with ``usage``, then ``data: [DONE]``.
``usage.completion_tokens = max_tokens``; ``usage.prompt_tokens`` = ``config.prompt_tokens``, else the
prompt's token ids or ``len(prompt) // 4`` of a text prompt. ``GET /health`` answers 200, so the launcher
can start it in place of vLLM (``server.dry_run``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

FAIL_MODES = ("http500", "close_mid_stream", "hang", "no_usage", "error_event")


@dataclass
class MockConfig:
    """Server behaviour; may be changed between requests while the server runs."""

    ttft_s: float = 0.0
    token_delay_s: float = 0.0  # per token: a chunk of k tokens follows the previous one after k * delay
    tokens_per_chunk: int = 1
    text_per_token: str = " x"  # "" gives empty deltas, as vLLM sends for partial UTF-8 tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens; None -> len(prompt) // 4
    fail: str | None = None  # one of FAIL_MODES, for every request
    fail_for: Callable[[int, dict[str, Any]], str | None] | None = None  # (arrival no., body) -> mode
    fail_after_chunks: int = 1  # close_mid_stream / error_event: after this many token chunks
    stamp_times: bool = False  # chunk text = server perf_counter_ns stamps (see _stamp_text)


@dataclass
class Seen:
    """What the server saw of one request (perf_counter seconds, same clock as the client's)."""

    arrival_no: int
    entered_s: float
    body_read_s: float
    prompt_chars: int
    max_tokens: int
    done_s: float | None = None


class MockServer:
    def __init__(self, config: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or MockConfig()
        self.host, self.port = host, port
        self.seen: list[Seen] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self._active: dict[asyncio.Task[Any], web.Request] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> MockServer:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)  # what the launcher polls before a run starts
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        """Stop at once, like a crashed server: stop listening, drop every connection, end handlers."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for site in list(runner.sites):
            await site.stop()
        for task, request in list(self._active.items()):
            if request.transport is not None:
                request.transport.abort()
            task.cancel()
        await asyncio.sleep(0)
        await runner.cleanup()

    async def __aenter__(self) -> MockServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._active[task] = request
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._serve(request)
        finally:
            self.in_flight -= 1
            self._active.pop(task, None)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        entered_ns = time.perf_counter_ns()
        raw = await request.read()
        read_ns = time.perf_counter_ns()
        body = json.loads(raw)
        prompt = body.get("prompt", "")
        max_tokens = int(body.get("max_tokens") or 16)
        seen = Seen(len(self.seen), entered_ns / 1e9, read_ns / 1e9, len(prompt), max_tokens)
        self.seen.append(seen)
        mode = cfg.fail_for(seen.arrival_no, body) if cfg.fail_for else cfg.fail
        if mode == "http500":
            return web.Response(status=500, text="mock server: internal error (told to fail)")
        if mode == "hang":
            await asyncio.sleep(3600)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": f"cmpl-mock-{seen.arrival_no}", "object": "text_completion",
                "created": int(time.time()), "model": body.get("model", "mock")}
        head = json.dumps(base)[:-1] + ', "choices": [{"index": 0, "text": '
        tail = ', "logprobs": null, "finish_reason": %s, "stop_reason": null}]}\n\n'
        start = time.perf_counter()
        next_t = start + cfg.ttft_s
        emitted = chunks = 0
        while emitted < max_tokens:
            k = min(cfg.tokens_per_chunk, max_tokens - emitted)
            if chunks == cfg.fail_after_chunks and mode in ("close_mid_stream", "error_event"):
                if mode == "error_event":
                    err = {"error": {"message": "mock engine failure", "type": "InternalServerError"}}
                    await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                    break
                assert request.transport is not None
                request.transport.abort()
                return resp
            delay = next_t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            emitted += k
            chunks += 1
            text = _stamp_text(entered_ns, read_ns) if cfg.stamp_times else cfg.text_per_token * k
            finish = '"length"' if emitted == max_tokens else "null"
            await resp.write(("data: " + head + json.dumps(text) + tail % finish).encode())
            next_t += cfg.token_delay_s * k
        counted = len(prompt) if isinstance(prompt, list) else len(prompt) // 4  # token ids, or text
        usage = {"prompt_tokens": cfg.prompt_tokens if cfg.prompt_tokens is not None else counted,
                 "completion_tokens": max_tokens}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if mode != "no_usage" and (body.get("stream_options") or {}).get("include_usage"):
            final = json.dumps({**base, "choices": [], "usage": usage})
            await resp.write(b"data: " + final.encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        seen.done_s = time.perf_counter()
        return resp


def _stamp_text(entered_ns: int, read_ns: int) -> str:
    """``"<entered_ns>,<body_read_ns>,<write_ns>;"``: perf_counter_ns (CLOCK_MONOTONIC on Linux, shared
    by all processes), so a client on the same machine can place the server's events on its own clock."""
    return f"{entered_ns},{read_ns},{time.perf_counter_ns()};"


def parse_stamps(text: str) -> list[tuple[int, int, int]]:
    """Inverse of the stamped chunk texts of one response: one (entered, body_read, write) per chunk."""
    out = []
    for part in text.split(";"):
        if part:
            a, b, c = part.split(",")
            out.append((int(a), int(b), int(c)))
    return out


@dataclass
class _Args:
    config: MockConfig = field(default_factory=MockConfig)
    port: int = 0


def _parse_args(argv: list[str] | None) -> _Args:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.0, help="seconds before the first chunk")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds per token after the first chunk")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=None)
    p.add_argument("--stamp-times", action="store_true")
    a = p.parse_args(argv)
    cfg = MockConfig(ttft_s=a.ttft, token_delay_s=a.token_delay, tokens_per_chunk=a.tokens_per_chunk,
                     prompt_tokens=a.prompt_tokens, stamp_times=a.stamp_times)
    return _Args(cfg, a.port)


async def _serve_forever(args: _Args) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with MockServer(args.config, port=args.port) as srv:
        print(f"PORT {srv.port}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve_forever(_parse_args(argv)))


if __name__ == "__main__":
    main()
