"""What the client measured for one request: timings from its own clock, token counts, and how it failed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it; times in seconds from the request's send, on the client's monotonic clock.

    `ttft_s` is send to the first streamed token; `itl_s` the gaps between successive streamed chunks that carried
    tokens; `e2e_s` send to the last token. A failed request (connection error, 4xx/5xx, 429 rejection, a stream
    that ended early) has `error` set and counts as an SLO violation.
    """

    index: int  # position in the plan
    url: str
    sent_s: float  # since the benchmark started
    prompt_tokens: int  # server-reported (usage) when available, else planned
    output_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()
    error: str | None = None
    status_code: int | None = None
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None and self.e2e_s is not None

    @property
    def rejected(self) -> bool:
        return self.status_code == 429

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1), as vLLM defines per-request TPOT; None for one-token outputs."""
        if not self.ok or self.output_tokens < 2:
            return None
        assert self.e2e_s is not None and self.ttft_s is not None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
