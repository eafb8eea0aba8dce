"""LLMEngine: the runtime's public surface. Accepts requests, runs one scheduler step plus one forward pass per
step(), samples, detokenizes, applies stop conditions and reports per-request outputs with timestamps (the single
source of every latency metric). Single-threaded: the server drives it from one worker thread.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpu_runtime.checkpoint.files import read_model_config
from gpu_runtime.config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    MAX_MODEL_LEN_CAP,
    EngineConfig,
    ModelConfig,
    SamplingParams,
    SchedulerKnobs,
)
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.logits_processing import processed_rows
from gpu_runtime.engine.logprobs import TokenLogprob, step_logprobs
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput, kv_bytes_per_block
from gpu_runtime.engine.sampling import Sampler, processed_probs
from gpu_runtime.engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from gpu_runtime.engine.sequence import RequestTimes, Sequence
from gpu_runtime.engine.step_trace import StepTrace
from gpu_runtime.quant import QuantReport, requantize
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings, parse_speculative_config
from gpu_runtime.speculative.decoder import SpecCounters, SpeculativeDecoder
from gpu_runtime.speculative.draft import DraftModelProposer
from gpu_runtime.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "RequestTimes",
    "SamplingParams",
    "SchedulerKnobs",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CUDA_ACTIVATION_RESERVE_BYTES = 1 << 30
DETOKENIZE_CONTEXT = 5  # prompt ids an output's detokenization starts from (vLLM's initial offset)


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_output_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    finish_reason: str | None
    times: RequestTimes
    token_times: list[float]
    logprobs: list[TokenLogprob] | None = None  # one per new token when the request asked for logprobs


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_total_blocks: int
    num_free_blocks: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    num_preemptions: int
    num_steps: int
    last_step_num_tokens: int
    # Speculative decoding (cumulative; vllm:spec_decode_*): verified drafts, drafted and accepted tokens, and how
    # often the draft token at each position was accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)


@dataclass
class _TextState:
    """Detokenized output of one request; text past `emitted` is held back while it could start a stop string."""

    detokenizer: IncrementalDetokenizer
    text: str = ""
    emitted: int = 0
    stop_holdback: int = 0
    token_times: list[float] = field(default_factory=list)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _resolve_dtype(name: str, model_cfg: ModelConfig, device: torch.device) -> torch.dtype:
    dtype = _DTYPES.get(model_cfg.torch_dtype, torch.float32) if name == "auto" else _DTYPES[name]
    if name == "auto" and device.type == "cpu" and dtype == torch.float16:
        return torch.float32  # fp16 matmuls on CPU are slow and not more accurate than fp32
    return dtype


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        path = Path(config.model)
        self.model_config = read_model_config(path)
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.model_config, self.device)
        self.max_model_len = self._max_model_len()
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(path, self.dtype, self.device, self.max_model_len, config.block_size)
        self.quantization = "none"
        if config.quantization != "none":  # before the KV cache, so on CUDA the freed weight memory goes to KV
            self.set_quantization(config.quantization)
        self.runner.allocate_kv_cache(self._num_blocks())
        self.tokenizer = Tokenizer(path, self.model_config.eos_token_ids)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.knobs.enable_prefix_caching)
        self.scheduler = Scheduler(config.knobs, self.block_manager)
        self.sampler = Sampler(self.device, config.seed)
        self._seqs: dict[str, Sequence] = {}
        self._texts: dict[str, _TextState] = {}
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

    def _max_model_len(self) -> int:
        limit = min(self.model_config.max_position_embeddings, MAX_MODEL_LEN_CAP)
        wanted = self.config.max_model_len or limit
        if wanted > self.model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len {wanted} exceeds the model's max_position_embeddings "
                f"{self.model_config.max_position_embeddings}"
            )
        return wanted

    def _num_blocks(self) -> int:
        per_block = kv_bytes_per_block(self.model_config, self.config.block_size, self.dtype)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(free - total * (1 - self.config.gpu_memory_utilization)) - _CUDA_ACTIVATION_RESERVE_BYTES
        else:
            budget = self.config.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"KV cache budget of {budget} bytes holds no block of {per_block} bytes")
        return num_blocks

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        self._validate_request(request_id, prompt_token_ids, params)
        seq = Sequence(
            request_id, list(prompt_token_ids), params, time.monotonic() if arrival_time is None else arrival_time
        )
        self._seqs[request_id] = seq
        holdback = max((len(s) for s in params.stop), default=1) - 1
        context = prompt_token_ids[-DETOKENIZE_CONTEXT:]
        self._texts[request_id] = _TextState(IncrementalDetokenizer(self.tokenizer, context), stop_holdback=holdback)
        self.scheduler.add(seq)

    def _validate_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        if min(prompt) < 0 or max(prompt) >= self.model_config.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        if any(not 0 <= token < self.model_config.vocab_size for token, _ in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {self.model_config.vocab_size})")
        if self.block_manager.blocks_needed(len(prompt) + params.max_tokens) > self.block_manager.num_total_blocks:
            raise ValueError(
                f"prompt + max_tokens needs more KV blocks than the whole cache holds "
                f"({self.block_manager.num_total_blocks} blocks of {self.config.block_size} tokens)"
            )

    def abort_request(self, request_id: str) -> None:
        """Free the request's KV blocks; the next step() reports it finished with finish_reason "abort"."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return
        self._finish(seq, "abort", time.monotonic())
        self._pending.append(self._output(seq, [], "", []))

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
        tokens, logprobs = self._forward_and_sample(sched, completing) if sched.scheduled else ([], [])
        now = time.monotonic()
        for item, new_tokens in zip(completing, tokens, strict=True):
            for token in new_tokens:
                item.seq.append_token(token, now)
        self.scheduler.on_step_done(sched)  # after appending: a verified draft's KV stays only if it was accepted
        for item, new_tokens, new_logprobs in zip(completing, tokens, logprobs, strict=True):
            outputs.append(self._process_tokens(item.seq, new_tokens, new_logprobs, now))
        self._num_steps += 1
        self._last_step_num_tokens = sched.num_batched_tokens
        if self._step_trace is not None:
            self._step_trace.record(sched, step_start, time.monotonic())
        return outputs

    def _forward_and_sample(
        self, sched: SchedulerOutput, completing: list[ScheduledSequence]
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None]]:
        """One forward pass; returns the new tokens of each completing sequence (1, or up to 1 + drafts) and their
        logprobs where the request asked for them."""
        inputs = [
            SequenceInput(
                _query_tokens(item),
                item.start,
                self.block_manager.block_ids(item.seq.request_id),
                1 + item.num_spec_tokens if item.completes else 0,
            )
            for item in sched.scheduled
        ]
        logits = self.runner.execute(inputs)
        rows = logits.split([1 + item.num_spec_tokens for item in completing])
        seqs = [item.seq for item in completing]
        drawn_from = processed_rows(rows, [s.params for s in seqs], [s.num_output_tokens for s in seqs],
                                    self.tokenizer.eos_token_ids)
        tokens: list[list[int]] = [[] for _ in completing]
        plain = [i for i, item in enumerate(completing) if not item.num_spec_tokens]
        if plain:
            sampled = self.sampler.sample(
                torch.cat([drawn_from[i] for i in plain]), [seqs[i].params for i in plain],
                [seqs[i].request_id for i in plain],
            )
            for i, token in zip(plain, sampled, strict=True):
                tokens[i] = [token]
        spec = [i for i, item in enumerate(completing) if item.num_spec_tokens]
        if spec and self._spec is not None:
            items = [completing[i] for i in spec]
            drafts = [item.seq.spec_token_ids[: item.num_spec_tokens] for item in items]
            verified = self._spec.verify([item.seq for item in items], drafts, [drawn_from[i] for i in spec])
            for i, new_tokens in zip(spec, verified, strict=True):
                tokens[i] = new_tokens
        return tokens, step_logprobs(list(rows), tokens, [item.seq.params.logprobs for item in completing])

    def _process_tokens(
        self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None, now: float
    ) -> RequestOutput:
        """Detokenize and check stop conditions token by token; tokens after a stop are dropped from the sequence."""
        state = self._texts[seq.request_id]
        num_before = seq.num_output_tokens - len(tokens)
        reason = None
        for i, token in enumerate(tokens):
            num_output = num_before + i + 1
            state.token_times.append(now)
            state.text += state.detokenizer.step(seq.output_token_ids[:num_output])
            reason = self._stop_reason(seq, token, state, num_output)
            if reason is not None:
                del seq.token_ids[seq.num_prompt_tokens + num_output :]
                tokens = tokens[: i + 1]
                logprobs = None if logprobs is None else logprobs[: i + 1]
                self._finish(seq, reason, now)
                break
        end = len(state.text) if reason else max(state.emitted, len(state.text) - state.stop_holdback)
        new_text, state.emitted = state.text[state.emitted : end], end
        times, state.token_times = state.token_times, []
        return self._output(seq, tokens, new_text, times, logprobs)

    def _stop_reason(self, seq: Sequence, token: int, state: _TextState, num_output: int) -> str | None:
        params = seq.params
        if num_output < params.min_tokens:  # vLLM: no stop of any kind before min_tokens, only the length bounds
            return "length" if seq.num_prompt_tokens + num_output >= self.max_model_len else None
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.tokenizer.eos_token_ids):
            return "stop"
        for stop in params.stop:
            index = state.text.find(stop, max(0, state.emitted - len(stop)))
            if index >= 0:
                state.text = state.text[:index]
                return "stop"
        if num_output >= params.max_tokens or seq.num_prompt_tokens + num_output >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self.scheduler.remove(seq)
        self.sampler.forget(seq.request_id)
        seq.finish_reason, seq.finished_time = reason, now
        del self._seqs[seq.request_id]

    def _output(self, seq: Sequence, new_ids: list[int], new_text: str, token_times: list[float],
                logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        if seq.is_finished:
            self._texts.pop(seq.request_id, None)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_ids,
            new_text=new_text,
            num_output_tokens=seq.num_output_tokens,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            times=seq.times(),
            token_times=token_times,
            logprobs=logprobs,
        )

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


def _query_tokens(item: ScheduledSequence) -> list[int]:
    """The step's query tokens of one sequence: its uncomputed tokens, then the drafts that fit the budget."""
    seq, end = item.seq, item.start + item.num_new_tokens
    if not item.num_spec_tokens:
        return seq.token_ids[item.start : end]
    return seq.token_ids[item.start :] + seq.spec_token_ids[: item.num_spec_tokens]
