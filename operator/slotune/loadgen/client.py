"""The OpenAI-compatible streaming client: one completions request, timed token by token.

`POST /v1/completions` with `stream: true`, `stream_options.include_usage` (the server's own token counts) and
`ignore_eos` (vLLM's extension, so the output is exactly `max_tokens` long and lengths follow the plan).
TTFT is send to the first chunk that carries text; inter-token latencies are the gaps between such chunks.
Every failure becomes a record with `error` set, never an exception: a benchmark must count what failed.
"""

from __future__ import annotations

import itertools
import json
import time

import httpx

from slotune.loadgen.record import RequestRecord


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
        "stream_options": {"include_usage": True}, "ignore_eos": True,
    }


async def send_completion(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                          index: int, sent_s: float, planned_prompt_tokens: int, warmup: bool = False
                          ) -> RequestRecord:
    """Stream one completion from `url` (the server root) and time it."""
    base = RequestRecord(index=index, url=url, sent_s=sent_s, prompt_tokens=planned_prompt_tokens, output_tokens=0,
                         warmup=warmup)
    start = time.perf_counter()
    token_times: list[float] = []
    usage: dict[str, int] = {}
    try:
        async with client.stream("POST", f"{url.rstrip('/')}/v1/completions",
                                 json=completion_body(model, prompt, max_tokens)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")[:200]
                return _failed(base, f"HTTP {response.status_code}: {body}", response.status_code)
            async for line in response.aiter_lines():
                finished = _consume(line, token_times, usage)
                if finished:
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        return _failed(base, f"{type(error).__name__}: {error}", None)
    if not token_times:
        return _failed(base, "stream ended without a token", 200)
    gaps = tuple(b - a for a, b in itertools.pairwise(token_times))
    return RequestRecord(
        index=index, url=url, sent_s=sent_s, prompt_tokens=usage.get("prompt_tokens", planned_prompt_tokens),
        output_tokens=usage.get("completion_tokens", len(token_times)), ttft_s=token_times[0] - start,
        e2e_s=token_times[-1] - start, itl_s=gaps, status_code=200, warmup=warmup,
    )


def _consume(line: str, token_times: list[float], usage: dict[str, int]) -> bool:
    """Handle one SSE line; True at `[DONE]`."""
    if not line.startswith("data:"):
        return False
    payload = line[5:].strip()
    if payload == "[DONE]":
        return True
    chunk = json.loads(payload)
    if chunk.get("usage"):
        usage.update({k: int(v) for k, v in chunk["usage"].items() if isinstance(v, int)})
    if any(choice.get("text") for choice in chunk.get("choices", [])):
        token_times.append(time.perf_counter())
    return False


def _failed(base: RequestRecord, error: str, status_code: int | None) -> RequestRecord:
    return RequestRecord(index=base.index, url=base.url, sent_s=base.sent_s, prompt_tokens=base.prompt_tokens,
                         output_tokens=0, error=error, status_code=status_code, warmup=base.warmup)
