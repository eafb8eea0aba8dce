"""A request's life inside the engine: its tokens, how many of them have KV in the cache, its status and the
timestamps every latency metric is derived from. Pure Python (no torch).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpu_runtime.config import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class RequestTimes:
    """Monotonic seconds (time.monotonic()) of a request's events; None until the event happened."""

    arrival: float
    first_scheduled: float | None
    first_token: float | None
    last_token: float | None
    finished: float | None


@dataclass(eq=False)
class Sequence:
    """Mutable per-request state owned by the scheduler; `token_ids` is prompt + output, kept in one list."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    finish_reason: str | None = None
    # Speculative decoding: tokens drafted for this step, scored after token_ids (never part of token_ids).
    spec_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now

    def times(self) -> RequestTimes:
        return RequestTimes(
            arrival=self.arrival_time,
            first_scheduled=self.first_scheduled_time,
            first_token=self.first_token_time,
            last_token=self.last_token_time,
            finished=self.finished_time,
        )
