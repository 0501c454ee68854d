"""One soak request to one server: the status, the error's class, each choice's token ids and top logprobs.

A separate small client from :mod:`harness.client` (which times requests): this one keeps what the
invariants compare (token ids per choice, the top-2 logprobs per token, the HTTP status and the error's
``type``) and can close the stream after ``abort_after`` token chunks, as a client that goes away does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.client import completions_url

TRANSPORT = 0  # the status recorded when no HTTP status came back (refused, reset, timeout)


@dataclass
class ArmReply:
    status: int = TRANSPORT
    error_type: str | None = None  # the error object's "type" (or the transport exception's class)
    error: str = ""
    tokens: dict[int, list[int]] = field(default_factory=dict)  # choice index -> token ids
    top: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # choice -> per token top logprobs
    chunks: int = 0
    completion_tokens: int | None = None
    done: bool = False  # data: [DONE] arrived
    aborted: bool = False  # the client closed the stream on purpose

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error_type": self.error_type,
            "error": self.error[:300],
            "chunks": self.chunks,
            "completion_tokens": self.completion_tokens,
            "done": self.done,
            "aborted": self.aborted,
            "tokens_per_choice": {k: len(v) for k, v in self.tokens.items()},
        }


def error_class(raw: bytes) -> tuple[str | None, str]:
    """(type, message) of an OpenAI-style error body (``{"error": {...}}`` or a flat ``ErrorResponse``)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None, raw[:300].decode("utf-8", "replace")
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        obj = obj["error"]
    if not isinstance(obj, dict):
        return None, str(obj)[:300]
    return (str(obj["type"]) if obj.get("type") is not None else None), str(obj.get("message", ""))[:300]


def _apply(obj: dict[str, Any], reply: ArmReply) -> None:
    if "error" in obj and not obj.get("choices"):
        reply.error_type, reply.error = error_class(json.dumps(obj).encode())
        reply.error_type = reply.error_type or "stream_error"
        return
    choices = obj.get("choices") or []
    if choices:
        reply.chunks += 1
    for ch in choices:
        i = int(ch.get("index", 0))
        reply.tokens.setdefault(i, []).extend(int(t) for t in ch.get("token_ids") or [])
        lp = ch.get("logprobs") or {}
        reply.top.setdefault(i, []).extend(dict(t or {}) for t in lp.get("top_logprobs") or [])
    usage = obj.get("usage")
    if usage:
        reply.completion_tokens = usage.get("completion_tokens")


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    abort_after: int | None,
    timeout_s: float,
) -> ArmReply:
    """Send one streamed request; never raises (a transport failure is ``status == TRANSPORT``)."""
    reply = ArmReply()
    try:
        async with session.post(
            completions_url(base_url), json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            reply.status = resp.status
            if resp.status != 200:
                reply.error_type, reply.error = error_class(await resp.content.read(8192))
                return reply
            buf = b""
            async for data in resp.content.iter_any():
                buf += data.replace(b"\r\n", b"\n")
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    payload = b"\n".join(x[5:].strip() for x in event.split(b"\n") if x.startswith(b"data:"))
                    if not payload:
                        continue
                    if payload == b"[DONE]":
                        reply.done = True
                        continue
                    _apply(json.loads(payload), reply)
                    # checked per event: a read can hold many events, and the cut must come after exactly
                    # abort_after chunks even when the client reads late
                    if abort_after is not None and reply.chunks >= abort_after and not reply.done:
                        reply.aborted = True
                        resp.close()  # drop the connection: the server sees the client go away
                        return reply
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:
        reply.error_type = reply.error_type or type(e).__name__
        where = f"after {reply.chunks} chunks" if reply.status == 200 else "before a response"
        reply.error = reply.error or f"{type(e).__name__} {where}: {e}"
        if reply.status == 200:
            reply.status = TRANSPORT  # a broken stream is not a success
    return reply
