"""Records what a served model answers to the probe set, through the OpenAI chat API any engine serves.

Greedy (temperature 0) answers with `logprobs` and `top_logprobs`, as vLLM and the builtin runtime render them: per
generated token its text, its logprob and the most likely alternatives. Nothing engine-specific is asked, so the
same recorder judges a builtin runtime, a vLLM pod or another engine build. Requests go out a few at a time over the
given URLs (replicas of one config answer alike), and every one must succeed: a partial record is no record.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
from pydantic import BaseModel, ConfigDict

from slotune.quality.probe_set import PROBE_SET_VERSION, PROBES, Probe

TOP_LOGPROBS = 5  # alternatives per token: the KL is taken over these plus one bucket for the rest


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TokenChoice(_Frozen):
    """One generated token: its text, logprob, and the most likely tokens at its position (text, logprob)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


class ProbeAnswer(_Frozen):
    tokens: tuple[TokenChoice, ...]

    @property
    def text(self) -> str:
        return "".join(t.token for t in self.tokens)


class QualityRecord(_Frozen):
    """The probe set's answers from one config; only records of the same set and length are compared."""

    probe_set_version: int = PROBE_SET_VERSION
    max_tokens: int
    answers: tuple[ProbeAnswer, ...]


class RecordFailed(RuntimeError):
    """A probe request failed or came back without logprobs: the engine cannot be judged this way."""


def record(urls: Sequence[str], model: str, max_tokens: int, probes: Sequence[Probe] = PROBES,
           concurrency: int = 4, timeout_s: float = 300.0) -> QualityRecord:
    """The greedy answers to `probes` from the servers at `urls` (spread round-robin)."""
    if not urls:
        raise RecordFailed("no server to ask")
    # A short connect timeout: an address nothing answers at (a pod IP out of reach) fails in seconds, not minutes.
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    with httpx.Client(timeout=timeout) as client, ThreadPoolExecutor(concurrency) as pool:
        answers = pool.map(lambda i: _ask(client, urls[i % len(urls)], model, probes[i], max_tokens),
                           range(len(probes)))
        return QualityRecord(max_tokens=max_tokens, answers=tuple(answers))


def _ask(client: httpx.Client, url: str, model: str, probe: Probe, max_tokens: int) -> ProbeAnswer:
    body = {"model": model, "messages": probe.messages(), "max_tokens": max_tokens, "temperature": 0.0,
            "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    try:
        response = client.post(f"{url}/v1/chat/completions", json=body)
    except httpx.HTTPError as error:
        raise RecordFailed(f"{url}: {error}") from error
    if response.status_code != 200:
        raise RecordFailed(f"{url} answered {response.status_code}: {response.text[:200]}")
    logprobs = (response.json()["choices"][0].get("logprobs") or {}).get("content")
    if logprobs is None:
        raise RecordFailed(f"{url} returned no logprobs (the engine must support OpenAI logprobs/top_logprobs)")
    return ProbeAnswer(tokens=tuple(
        TokenChoice(token=t["token"], logprob=t["logprob"],
                    top=tuple((a["token"], a["logprob"]) for a in t.get("top_logprobs") or ()))
        for t in logprobs))
