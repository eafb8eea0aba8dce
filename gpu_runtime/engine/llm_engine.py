"""LLMEngine: the runtime's public surface. Accepts requests, runs one scheduler step plus one forward pass per
step(), and reports per-request outputs with timestamps (the single source of every latency metric). Single-threaded:
the server drives it from one worker thread.

The work is split by responsibility, as in nano-vllm: `limits` settles device, dtype and sizes and checks requests,
the `scheduler` picks each step's sequences, `forward_step` runs the model and samples, `output_processor`
detokenizes and applies stop conditions; this class holds them together and owns the live switches.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from gpu_runtime.checkpoint.files import read_model_config
from gpu_runtime.config import EngineConfig, SamplingParams, SchedulerKnobs
from gpu_runtime.engine import limits
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.forward_step import ForwardStep
from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.engine.model_runner import ModelRunner
from gpu_runtime.engine.output_processor import OutputProcessor
from gpu_runtime.engine.outputs import EngineStats, RequestOutput
from gpu_runtime.engine.sampling import Sampler, processed_probs
from gpu_runtime.engine.scheduler import Scheduler
from gpu_runtime.engine.sequence import RequestTimes, Sequence
from gpu_runtime.engine.step_trace import StepTrace
from gpu_runtime.quant import QuantReport, requantize
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings, parse_speculative_config
from gpu_runtime.speculative.decoder import SpecCounters, SpeculativeDecoder
from gpu_runtime.speculative.draft import DraftModelProposer
from gpu_runtime.tokenizer.tokenizer import Tokenizer

__all__ = [
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "RequestTimes",
    "SamplingParams",
    "SchedulerKnobs",
]


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        path = Path(config.model)
        self.model_config = read_model_config(path)
        self.device = limits.resolve_device(config.device)
        self.dtype = limits.resolve_dtype(config.dtype, self.model_config, self.device)
        self.max_model_len = limits.max_model_len(config, self.model_config)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(path, self.dtype, self.device, self.max_model_len, config.block_size)
        self.quantization = "none"
        if config.quantization != "none":  # before the KV cache, so on CUDA the freed weight memory goes to KV
            self.set_quantization(config.quantization)
        self.runner.allocate_kv_cache(limits.num_kv_blocks(config, self.model_config, self.dtype, self.device))
        self.tokenizer = Tokenizer(path, self.model_config.eos_token_ids)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.knobs.enable_prefix_caching)
        self.scheduler = Scheduler(config.knobs, self.block_manager)
        self.sampler = Sampler(self.device, config.seed)
        self._forward = ForwardStep(self.runner, self.block_manager, self.sampler, self.tokenizer.eos_token_ids)
        self._outputs = OutputProcessor(self.tokenizer, self.max_model_len)
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []
        self._num_steps = 0
        self._last_step_num_tokens = 0
        self._generate_ids = itertools.count()
        self._step_trace = StepTrace.from_env()  # opt-in (GPU_RUNTIME_STEP_TRACE=PATH), off by default
        self._spec: SpeculativeDecoder | None = None
        self._spec_counters = SpecCounters()  # outlives set_speculative: the metrics are monotonic counters
        self.set_speculative(config.speculative)

    @property
    def knobs(self) -> SchedulerKnobs:
        return self.scheduler.knobs

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in flight")
        limits.check_request(prompt_token_ids, params, self.model_config, self.max_model_len, self.block_manager)
        seq = Sequence(
            request_id, list(prompt_token_ids), params, time.monotonic() if arrival_time is None else arrival_time
        )
        self._seqs[request_id] = seq
        self._outputs.add(request_id, prompt_token_ids, params)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Free the request's KV blocks; the next step() reports it finished with finish_reason "abort"."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return
        self._finish(seq, "abort", time.monotonic())
        self._pending.append(self._outputs.output(seq, [], "", []))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    def reconfigure(self, knobs: SchedulerKnobs) -> None:
        """Apply new knobs from the next step on; in-flight requests continue (the engine is single-threaded, so
        this always runs between steps)."""
        self.scheduler.set_knobs(knobs)

    # ---- speculative decoding and quantization (live switches, between steps) ---------------------------------
    @property
    def speculative(self) -> SpeculativeSettings | None:
        return None if self._spec is None else self._spec.settings

    def set_speculative(self, settings: SpeculativeSettings | Mapping[str, object] | str | None) -> None:
        """Turn speculative decoding on (vLLM --speculative-config JSON, its dict, or settings), change it, or off
        (None). In-flight requests continue; a bad config raises and leaves the current one in place."""
        if settings is not None and not isinstance(settings, SpeculativeSettings):
            settings = parse_speculative_config(settings)
        spec = None if settings is None else self._build_speculative(settings)
        for seq in self.scheduler.running:
            seq.spec_token_ids = []
        self._spec = spec

    def _build_speculative(self, settings: SpeculativeSettings) -> SpeculativeDecoder:
        draft = None
        if settings.method is SpecMethod.DRAFT_MODEL:
            old = self._spec
            same = old is not None and old.draft is not None and old.settings.draft_model == settings.draft_model
            draft = old.draft if same else DraftModelProposer.load(  # type: ignore[union-attr]
                Path(str(settings.draft_model)), self.model_config,
                (self.dtype, self.device, self.max_model_len, self.config.block_size, self.runner.num_blocks),
                processed_probs, self.config.seed,
            )
        return SpeculativeDecoder(
            settings, self.max_model_len, processed_probs, self.sampler.generator,
            self._spec_counters, draft,
        )

    def set_quantization(self, scheme: str) -> QuantReport:
        """Re-quantize the weights from the checkpoint in process ("none" | "int8" | "fp8"); returns weight bytes
        before and after. Raises ValueError for unknown schemes and Fp8UnsupportedError where fp8 cannot run."""
        report = requantize(self.runner.model, scheme, lambda _: self.runner.reload_weights())
        self.quantization = report.scheme.value
        return report

    # ---- the step -------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        step_start = time.monotonic()
        outputs, self._pending = self._pending, []
        if self._spec is None:
            sched = self.scheduler.schedule()
        else:  # drafts get their KV slots from the scheduler, like every other token
            self._spec.prepare(self.scheduler.running)
            sched = self.scheduler.schedule(self._spec.num_lookahead)
            self._spec.fill(sched, self.block_manager.block_ids)
        now = time.monotonic()
        for item in sched.scheduled:
            if item.seq.first_scheduled_time is None:
                item.seq.first_scheduled_time = now
        completing = [item for item in sched.scheduled if item.completes]
        tokens, logprobs = self._forward.run(sched, completing, self._spec) if sched.scheduled else ([], [])
        now = time.monotonic()
        for item, new_tokens in zip(completing, tokens, strict=True):
            for token in new_tokens:
                item.seq.append_token(token, now)
        self.scheduler.on_step_done(sched)  # after appending: a verified draft's KV stays only if it was accepted
        for item, new_tokens, new_logprobs in zip(completing, tokens, logprobs, strict=True):
            outputs.append(self._process(item.seq, new_tokens, new_logprobs, now))
        self._num_steps += 1
        self._last_step_num_tokens = sched.num_batched_tokens
        if self._step_trace is not None:
            self._step_trace.record(sched, step_start, time.monotonic())
        return outputs

    def _process(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None, now: float
                 ) -> RequestOutput:
        tokens, new_text, times, logprobs, reason = self._outputs.process(seq, tokens, logprobs, now)
        if reason is not None:
            self._finish(seq, reason, now)
        return self._outputs.output(seq, tokens, new_text, times, logprobs)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self.scheduler.remove(seq)
        self.sampler.forget(seq.request_id)
        seq.finish_reason, seq.finished_time = reason, now
        del self._seqs[seq.request_id]

    # ---- introspection and convenience ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=bm.usage,
            num_total_blocks=bm.num_total_blocks,
            num_free_blocks=bm.num_free_blocks,
            prefix_cache_queries_tokens=bm.prefix_cache_queries_tokens,
            prefix_cache_hits_tokens=bm.prefix_cache_hits_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._num_steps,
            last_step_num_tokens=self._last_step_num_tokens,
            spec_num_drafts=self._spec_counters.num_drafts,
            spec_num_draft_tokens=self._spec_counters.num_draft_tokens,
            spec_num_accepted_tokens=self._spec_counters.num_accepted_tokens,
            spec_num_accepted_tokens_per_pos=list(self._spec_counters.num_accepted_tokens_per_pos),
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Run the prompts to completion (alongside any other requests) and return their output token ids."""
        batch = next(self._generate_ids)
        ids = [f"generate-{batch}-{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts, strict=True):
            self.add_request(rid, prompt, params)
        results: dict[str, list[int]] = {rid: [] for rid in ids}
        while any(rid in self._seqs for rid in ids):
            for out in self.step():
                if out.request_id in results:
                    results[out.request_id].extend(out.new_token_ids)
        return [results[rid] for rid in ids]

