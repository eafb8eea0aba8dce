"""One benchmark case: a trace segment, how it is scaled, the model on its accelerator, the SLO, the fleet's limits.

`PAIRS` are the model/accelerator pairs of the committed results, each with the per-trace load it is replayed at
(rates chosen so a pool sized for the peak needs several replicas: scaling can then save something). Mooncake's
prompts are cut to 7,168 tokens and outputs to 1,024 so every request fits a `max_model_len` of 8,192 (longer ones
would be refused; 46% of its prompts are longer); Azure's fit uncut. Mooncake's SLO allows 5 s to the first token:
its prompts are seven times Azure's, and prefilling 7,000 tokens alone takes about a second on an A100.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.roofline import Efficiency
from slotune.slo import SLOSpec
from slotune.traces import TraceFormat, TraceReplay

WINDOW_S = 60.0
SEGMENT_S = 1800.0  # the first 30 minutes of each trace (trace time): both passes of every strategy fit the budget


@dataclass(frozen=True)
class TraceLoad:
    """How one trace is replayed for one pair."""

    rate_per_s: float
    slo: SLOSpec
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class Pair:
    model: str
    accelerator: str
    tensor_parallel: int
    startup_s: float
    max_replicas: int
    loads: dict[TraceFormat, TraceLoad]


@dataclass(frozen=True)
class TraceCase:
    trace: Path
    trace_format: TraceFormat
    model: str
    accelerator: str
    tensor_parallel: int
    startup_s: float
    max_replicas: int
    load: TraceLoad
    start_s: float = 0.0
    duration_s: float | None = SEGMENT_S
    window_s: float = WINDOW_S
    max_model_len: int = 8192

    @property
    def replay(self) -> TraceReplay:
        return TraceReplay(self.trace, self.trace_format, self.load.rate_per_s, self.start_s, self.duration_s,
                           self.load.max_prompt_tokens, self.load.max_output_tokens)

    @property
    def deployment(self) -> Deployment:
        """The profiles' deployment, its prior efficiencies filled in once (the step model would rebuild them every
        step: a fifth of the simulation's time)."""
        named = Deployment.from_names(self.model, self.accelerator, self.tensor_parallel, self.max_model_len)
        return replace(named, efficiency=Efficiency.prior(named.accelerator))

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel

    def with_load(self, **changes: object) -> TraceCase:
        return replace(self, load=replace(self.load, **changes))


AZURE_SLO = SLOSpec.model_validate({"ttft": {"p99": 2000}, "tpot": {"p99": 100}})
MOONCAKE_SLO = SLOSpec.model_validate({"ttft": {"p99": 5000}, "tpot": {"p99": 100}})
MOONCAKE_CUT = {"max_prompt_tokens": 7168, "max_output_tokens": 1024}

PAIRS: tuple[Pair, ...] = (
    Pair("llama-3.1-8b", "nvidia-a100-40gb", 1, 120.0, 12, {
        TraceFormat.AZURE: TraceLoad(10.0, AZURE_SLO),
        TraceFormat.MOONCAKE: TraceLoad(2.0, MOONCAKE_SLO, **MOONCAKE_CUT)}),
    Pair("llama-3.1-70b", "nvidia-h100-80gb", 4, 180.0, 12, {
        TraceFormat.AZURE: TraceLoad(10.0, AZURE_SLO),
        TraceFormat.MOONCAKE: TraceLoad(2.0, MOONCAKE_SLO, **MOONCAKE_CUT)}),
    Pair("llama-3.1-8b", "nvidia-l4", 1, 60.0, 12, {
        TraceFormat.AZURE: TraceLoad(3.0, AZURE_SLO),
        TraceFormat.MOONCAKE: TraceLoad(0.6, MOONCAKE_SLO, **MOONCAKE_CUT)}),
)


def cases_for(trace: Path, trace_format: TraceFormat, pairs: tuple[Pair, ...] = PAIRS) -> list[TraceCase]:
    return [TraceCase(trace, trace_format, p.model, p.accelerator, p.tensor_parallel, p.startup_s, p.max_replicas,
                      p.loads[trace_format]) for p in pairs]
