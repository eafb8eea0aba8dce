"""What traffic looks like: the workload spec and the seeded plan of requests drawn from it.

`WorkloadSpec` is `spec.workload` of a TunedModel (camelCase on the wire) and the input of `slotune bench` and the
simulator. A profile (chat, code, summarization, prefix-heavy) fills in every field the user leaves out, from the
public traces quoted in docs/facts.md#traffic. `plan_requests` turns a spec into a reproducible list of
`PlannedRequest`s (arrival time, prompt and output lengths, shared-prefix group), the same list for the same seed,
so a benchmark, a replay and a simulation of one workload see identical requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from scipy import stats

# z-score of the 99th percentile of a standard normal: ln(p99 / p50) = sigma * Z_P99 for a lognormal.
Z_P99 = float(stats.norm.ppf(0.99))


class Profile(StrEnum):
    CHAT = "chat"
    CODE = "code"
    SUMMARIZATION = "summarization"
    PREFIX_HEAVY = "prefix-heavy"
    CUSTOM = "custom"


class Arrival(StrEnum):
    POISSON = "poisson"
    GAMMA = "gamma"
    CONSTANT = "constant"
    CONCURRENCY = "concurrency"


class PromptText(StrEnum):
    """What the load generator writes prompts from (slotune.loadgen.prompts)."""

    WORDS = "words"  # short common English words, about one token each on large vocabularies
    CHAT = "chat"  # the shipped chat-style messages (loadgen/chat_prompts.json), system prompts as shared prefixes


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class LengthDistribution(_Spec):
    """A token-length distribution: a lognormal through the given median and 99th percentile, rounded and clipped."""

    p50: float = Field(gt=0, description="Median length in tokens.")
    p99: float = Field(gt=0, description="99th percentile length in tokens; equal to p50 for a fixed length.")
    min: int = Field(default=1, ge=1, description="Shortest length drawn, in tokens (draws below are raised to it).")
    max: int = Field(default=32768, ge=1, description="Longest length drawn, in tokens (draws above are cut to it).")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.p99 < self.p50:
            raise ValueError(f"p99 ({self.p99}) must be at least p50 ({self.p50})")
        if not self.min <= self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return (math.log(self.p99) - math.log(self.p50)) / Z_P99

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raw = rng.lognormal(self.mu, self.sigma, size) if self.sigma > 0 else np.full(size, self.p50)
        return np.clip(np.rint(raw), self.min, self.max).astype(int)

    def cdf(self, tokens: np.ndarray | float) -> np.ndarray:
        """CDF of the continuous lognormal before rounding and clipping (for goodness-of-fit checks)."""
        return stats.lognorm.cdf(tokens, s=self.sigma, scale=math.exp(self.mu))


@dataclass(frozen=True)
class _ProfileDefaults:
    arrival: Arrival
    arrival_cv: float
    prompt: LengthDistribution
    output: LengthDistribution
    shared_prefix_tokens: int
    shared_prefix_share: float
    num_prefix_groups: int


# Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA'24) via docs/facts.md#traffic: conversation
# prompt p50 1020 / p99 4142, output p50 129 / p99 601, CV 1.09; code prompt p50 1469 / p99 7436, output p50 13 /
# p99 251, CV 13.2. arXiv summarization gives only medians (2730 / 167): its p99s below are our assumption
# (about 2.5x and 3x the median). prefix-heavy is our own: a 1024-token system prompt shared by 90% of requests in
# 4 groups (a few agents or few-shot templates), for exercising prefix caching.
_PROFILE_DEFAULTS: dict[Profile, _ProfileDefaults] = {
    Profile.CHAT: _ProfileDefaults(
        Arrival.GAMMA, 1.09, LengthDistribution(p50=1020, p99=4142), LengthDistribution(p50=129, p99=601), 0, 0.0, 1
    ),
    Profile.CODE: _ProfileDefaults(
        Arrival.GAMMA, 13.2, LengthDistribution(p50=1469, p99=7436), LengthDistribution(p50=13, p99=251), 0, 0.0, 1
    ),
    Profile.SUMMARIZATION: _ProfileDefaults(
        Arrival.POISSON, 1.0, LengthDistribution(p50=2730, p99=6800), LengthDistribution(p50=167, p99=500), 0, 0.0, 1
    ),
    Profile.PREFIX_HEAVY: _ProfileDefaults(
        Arrival.POISSON, 1.0, LengthDistribution(p50=1800, p99=4000, min=1100),
        LengthDistribution(p50=128, p99=400), 1024, 0.9, 4,
    ),
}


class WorkloadSpec(_Spec):
    """The traffic a deployment serves: arrival process, prompt and output lengths, shared prefixes."""

    profile: Profile = Field(
        default=Profile.CHAT,
        description="Named workload shape (chat, code, summarization, prefix-heavy) that fills in every field left "
        "out; custom requires promptTokens and outputTokens.",
    )
    request_rate_per_s: float | None = Field(
        default=None, gt=0, description="Mean request arrival rate in requests per second (open-loop arrivals)."
    )
    arrival: Arrival | None = Field(
        default=None,
        description="Arrival process: poisson, gamma (bursty, see arrivalCv), constant (evenly spaced) or "
        "concurrency (closed loop: a new request as soon as one of `concurrency` finishes). Default: the profile's.",
    )
    arrival_cv: float | None = Field(
        default=None, gt=0, description="Coefficient of variation of inter-arrival gaps for gamma arrivals "
        "(1 = Poisson, larger = burstier). Default: the profile's.",
    )
    concurrency: int | None = Field(
        default=None, ge=1, description="Requests kept in flight for concurrency arrivals; for the other arrival "
        "processes an upper bound on requests in flight (unset = unbounded).",
    )
    prompt_tokens: LengthDistribution | None = Field(
        default=None, description="Prompt length distribution in tokens, shared prefix included. Default: the "
        "profile's.",
    )
    output_tokens: LengthDistribution | None = Field(
        default=None, description="Output length distribution in tokens (generation is forced to this length). "
        "Default: the profile's.",
    )
    shared_prefix_tokens: int | None = Field(
        default=None, ge=0, description="Length of the prompt prefix shared within a prefix group, in tokens "
        "(a system prompt or few-shot template). Default: the profile's.",
    )
    shared_prefix_share: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of requests that start with a shared prefix. "
        "Default: the profile's.",
    )
    num_prefix_groups: int | None = Field(
        default=None, ge=1, description="Number of distinct shared prefixes; requests with a prefix pick one "
        "uniformly. Default: the profile's.",
    )
    prompt_text: PromptText = Field(
        default=PromptText.WORDS, description="Text the load generator writes prompts from, at the planned lengths: "
        "words (short common English words) or chat (chat-style user messages shipped with slotune, a group's shared "
        "prefix drawn from its system prompts), so prefix caching and speculation face real text. Lengths, arrivals "
        "and prefix groups are the same either way.",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_profile_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        profile = Profile(data.get("profile", Profile.CHAT))
        if profile == Profile.CUSTOM:
            return data
        defaults = _PROFILE_DEFAULTS[profile]
        filled = dict(data)
        for name, value in (
            ("arrival", defaults.arrival), ("arrival_cv", defaults.arrival_cv), ("prompt_tokens", defaults.prompt),
            ("output_tokens", defaults.output), ("shared_prefix_tokens", defaults.shared_prefix_tokens),
            ("shared_prefix_share", defaults.shared_prefix_share), ("num_prefix_groups", defaults.num_prefix_groups),
        ):
            if filled.get(name) is None and filled.get(to_camel(name)) is None:
                filled[name] = value
        return filled

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.prompt_tokens is None or self.output_tokens is None:
            raise ValueError("profile custom needs promptTokens and outputTokens")
        if self.arrival == Arrival.CONCURRENCY and self.concurrency is None:
            raise ValueError("arrival concurrency needs concurrency (requests kept in flight)")
        if self.shared_prefix_tokens and self.prompt_tokens.min <= self.shared_prefix_tokens:
            raise ValueError(f"promptTokens.min ({self.prompt_tokens.min}) must exceed sharedPrefixTokens "
                             f"({self.shared_prefix_tokens}) so every prompt has its own suffix")
        return self

    @property
    def prompt(self) -> LengthDistribution:
        assert self.prompt_tokens is not None  # guaranteed by _complete
        return self.prompt_tokens

    @property
    def output(self) -> LengthDistribution:
        assert self.output_tokens is not None  # guaranteed by _complete
        return self.output_tokens

    @property
    def arrival_process(self) -> Arrival:
        return self.arrival or Arrival.POISSON

    @property
    def is_closed_loop(self) -> bool:
        return self.arrival_process == Arrival.CONCURRENCY


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: when (seconds after the start), how long its prompt and output are, which prefix."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None  # None: no shared prefix
    shared_prefix_tokens: int  # 0 when prefix_group is None and no prefix_block_ids
    prefix_block_ids: tuple[int, ...] = ()  # a replayed trace's prompt blocks (slotune.traces): equal ids, equal text


def interarrival_gaps_s(spec: WorkloadSpec, rng: np.random.Generator, size: int) -> np.ndarray:
    """Gaps between arrivals in seconds, mean 1/rate; all zero for closed-loop (concurrency) workloads."""
    process = spec.arrival_process
    if process == Arrival.CONCURRENCY:
        return np.zeros(size)
    if spec.request_rate_per_s is None:
        raise ValueError(f"arrival {process.value} needs requestRatePerS")
    mean_gap_s = 1.0 / spec.request_rate_per_s
    if process == Arrival.CONSTANT:
        return np.full(size, mean_gap_s)
    if process == Arrival.POISSON:
        return rng.exponential(mean_gap_s, size)
    # Gamma with shape k has CV 1/sqrt(k): k = 1/cv^2, scale = mean/k keeps the mean gap at 1/rate.
    shape = 1.0 / (spec.arrival_cv or 1.0) ** 2
    return rng.gamma(shape, mean_gap_s / shape, size)


def iter_requests(spec: WorkloadSpec, seed: int = 0, chunk: int = 256) -> Iterator[PlannedRequest]:
    """An endless seeded stream of planned requests; arrivals, lengths and prefixes draw from independent streams."""
    arrival_rng, prompt_rng, output_rng, prefix_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    clock_s = 0.0
    prefix_tokens = spec.shared_prefix_tokens or 0
    while True:
        gaps = interarrival_gaps_s(spec, arrival_rng, chunk)
        prompts = spec.prompt.sample(prompt_rng, chunk)
        outputs = spec.output.sample(output_rng, chunk)
        has_prefix = prefix_rng.random(chunk) < (spec.shared_prefix_share or 0.0) if prefix_tokens else np.zeros(
            chunk, dtype=bool)
        groups = prefix_rng.integers(0, spec.num_prefix_groups or 1, chunk)
        for i in range(chunk):
            clock_s += float(gaps[i])
            yield PlannedRequest(
                arrival_s=clock_s, prompt_tokens=int(prompts[i]), output_tokens=int(outputs[i]),
                prefix_group=int(groups[i]) if has_prefix[i] else None,
                shared_prefix_tokens=prefix_tokens if has_prefix[i] else 0,
            )


def plan_requests(
    spec: WorkloadSpec, num_requests: int | None = None, duration_s: float | None = None, seed: int = 0
) -> list[PlannedRequest]:
    """Exactly `num_requests` requests, or every request arriving within `duration_s` seconds (open loop only)."""
    if (num_requests is None) == (duration_s is None):
        raise ValueError("give exactly one of num_requests and duration_s")
    stream = iter_requests(spec, seed)
    if num_requests is not None:
        if num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {num_requests}")
        return [next(stream) for _ in range(num_requests)]
    if spec.is_closed_loop:
        raise ValueError("a closed-loop (concurrency) workload has no arrival times: give num_requests, or use "
                         "iter_requests and stop by time")
    planned = []
    for request in stream:
        if request.arrival_s > duration_s:
            return planned
        planned.append(request)
    return planned
