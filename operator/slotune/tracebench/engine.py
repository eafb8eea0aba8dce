"""The two engine configurations every baseline runs with: vLLM's defaults and the oracle's.

vLLM's defaults are those of the V1 engine's OpenAI server (vLLM 0.8 onward, the engine the simulator's scheduler
follows: chunked prefill and prefix caching on): `--max-num-seqs 256`, `--max-num-batched-tokens` 2048, or 8192 on
GPUs with 70 GB or more (H100-class), chunked prefill on, prefix caching on, no speculative decoding, no
quantization, `--kv-cache-dtype auto`, `--gpu-memory-utilization 0.9`, `--block-size 16`.

The oracle's config is the best one found by searching the knob space on the simulator: every combination of the
ladders below, each profiled for the highest constant arrival rate one replica serves within the SLO (profile.py),
the config with the highest such rate winning. It sees the trace's lengths, as an offline sweep would, never its
arrival times.
"""

from __future__ import annotations

import itertools

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.slo import SLOSpec
from slotune.tracebench.profile import Capacity, profile_capacity
from slotune.workload import PlannedRequest

H100_CLASS_BYTES = 70e9
SEQS_LADDER = (64, 128, 256)
BUDGET_LADDER = (1024, 2048, 8192)


def vllm_defaults(deployment: Deployment) -> RuntimeConfig:
    budget = 8192 if deployment.accelerator.memory_bytes >= H100_CLASS_BYTES else 2048
    return RuntimeConfig(max_num_seqs=256, max_num_batched_tokens=budget, enable_chunked_prefill=True,
                         enable_prefix_caching=True, speculative=None, replicas=1)


def oracle_config(deployment: Deployment, slo: SLOSpec, lengths: list[PlannedRequest]) -> tuple[RuntimeConfig,
                                                                                                   Capacity]:
    """The searched config with the most SLO-meeting rate per replica (ties: the earlier, smaller one)."""
    best: tuple[RuntimeConfig, Capacity] | None = None
    for seqs, budget in itertools.product(SEQS_LADDER, BUDGET_LADDER):
        config = RuntimeConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, replicas=1)
        if deployment.startup_error(config) is not None:
            continue
        capacity = profile_capacity(deployment, config, slo, lengths)
        if best is None or capacity.rate_per_s > best[1].rate_per_s:
            best = (config, capacity)
    if best is None:
        raise ValueError("no searched config starts on this deployment")
    return best
