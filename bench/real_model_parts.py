"""The measurements bench/bench_real_model.py takes, one function each: bandwidth, batch-1 decode of each side, the
engine's profile, speculation, int8 quality and the machine it ran on. The HTTP streams are in real_model_streams.py
and the report's markdown in real_model_report.py."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import llama_cpp_peer
from bench.real_model_report import markdown
from bench.real_model_streams import stream_throughput
from gpu_runtime.engine.llm_engine import LLMEngine, SamplingParams
from gpu_runtime.model import cpu_blas, cpu_kernels
from gpu_runtime.quant.apply import requantize, weight_bytes
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.protocol import ChatMessage
from slotune.quality.probe_set import PROBES

__all__ = ["markdown", "stream_throughput"]

DECODE_PROMPT = ("The history of the printing press begins in the fifteenth century, when a goldsmith in Mainz "
                 "combined movable metal type, oil-based ink and a wooden press.")
# Repetitive text: the answer copies the prompt, the case n-gram speculation is for (a list of weekdays was not: the
# model does not continue it, and acceptance fell to ~0.2). Free text: an open question.
REPETITIVE_REQUEST = ("Repeat the following text exactly, word for word: The old lighthouse keeper climbed the narrow "
                      "stairs every evening, lit the great lamp, and watched the ships pass safely through the dark "
                      "and stormy channel. In the morning he wrote the names of the ships in a thick blue book, "
                      "made tea, and slept until the gulls woke him at noon.")
FREE_REQUEST = "Tell me about your favourite season and why."
PREFILL_TOKENS = (512, 2048)  # prompt lengths whose prefill both sides time in every round
COPY_REPEATS = 3  # copies per bandwidth sample: one sample lasts about as long as a few decode steps


@dataclass
class Sides:
    engine: LLMEngine
    int8: LLMEngine
    hf: nn.Module
    bandwidth: Bandwidth
    llama_url: str | None
    weight_bytes: int
    before: Any = None  # the engine at bench.real_model_before.BEFORE_REV, same file and settings
    llama_q8_url: str | None = None  # llama.cpp on the same file requantized to Q8_0 (against our int8)
    int8_fp32_head: LLMEngine | None = None  # int8 layers with the embedding and head in fp32, as before


class Bandwidth:
    """Two buffers the size of the weights: copy (bytes read + written per second) and sum (bytes read per second)."""

    def __init__(self, nbytes: int) -> None:
        self.src = torch.ones(nbytes // 4)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)  # first touch: page faults are not bandwidth

    def copy(self) -> float:
        return self.copy_times()[0]

    def copy_times(self) -> tuple[float, float]:
        """Copy bandwidth by wall time and by this thread's CPU time (which a core lost to other processes does
        not inflate: the decode steps are timed both ways too)."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        for _ in range(COPY_REPEATS):
            self.dst.copy_(self.src)
        nbytes = 2 * self.src.nbytes * COPY_REPEATS
        return nbytes / (time.perf_counter() - start), nbytes / (time.thread_time() - cpu_start)

    def read(self) -> float:
        start = time.perf_counter()
        for _ in range(COPY_REPEATS):
            self.src.sum()
        return self.src.nbytes * COPY_REPEATS / (time.perf_counter() - start)


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes a batch-1 decode step reads: every weight storage once, except an untied embedding (one row)."""
    total = weight_bytes(model)
    embedding, head = _table(model.embed_tokens), _table(model.lm_head)
    if head is None or embedding.untyped_storage().data_ptr() != head.untyped_storage().data_ptr():
        total -= embedding.untyped_storage().nbytes()
    return total


def _table(module: nn.Module) -> torch.Tensor | None:
    """The weight of an embedding or head: full precision, or the int8 table a quantized one holds."""
    for name in ("weight", "weight_q", "weight_int8"):
        if isinstance(getattr(module, name, None), torch.Tensor):
            return getattr(module, name)
    return None


def engine_decode_ms(engine: LLMEngine, prompt: list[int], max_tokens: int) -> float:
    """Median time of the steps in which the one request decodes one token (prefill excluded)."""
    return engine_decode_times(engine, prompt, max_tokens)[0]


def engine_decode_times(engine: Any, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """(wall ms, thread CPU ms): medians over the steps in which the one request decodes one token. `engine` may
    be an earlier revision's (bench.real_model_before): its own SamplingParams are used."""
    params_cls = getattr(sys.modules[type(engine).__module__], "SamplingParams", SamplingParams)
    engine.add_request(f"decode-{time.monotonic_ns()}", prompt,
                       params_cls(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    steps: list[float] = []
    cpu: list[float] = []
    while engine.has_unfinished_requests():
        start, cpu_start = time.perf_counter(), time.thread_time()
        engine.step()
        elapsed, cpu_elapsed = time.perf_counter() - start, time.thread_time() - cpu_start
        stats = engine.stats()
        if stats.last_step_num_tokens == 1 and stats.num_running == 1:
            steps.append(elapsed)
            cpu.append(cpu_elapsed)
    return statistics.median(steps) * 1e3, statistics.median(cpu) * 1e3


@contextmanager
def torch_gemv() -> Iterator[None]:
    """Batch-1 steps on PyTorch ops with torch's own GEMV (MKL), as before gpu_runtime.model.cpu_blas and
    cpu_kernels, then restored."""
    previous = cpu_blas.set_enabled(False)
    try:
        with pytorch_path():
            yield
    finally:
        cpu_blas.set_enabled(previous)


@contextmanager
def pytorch_path() -> Iterator[None]:
    """Batch-1 steps on PyTorch ops instead of the C kernels (gpu_runtime.model.cpu_kernels), then restored."""
    previous = cpu_kernels.set_enabled(False)
    try:
        yield
    finally:
        cpu_kernels.set_enabled(previous)


@contextmanager
def row_major(model: nn.Module) -> Iterator[None]:
    """The model with its Linear weights stored row-major, as before gpu_runtime.model.cpu_layout, then given back
    their own storage, so every round measures the engine on the pages it was loaded into (laying them out afresh
    moved them each round; the later rounds' slowdown first blamed on that was the C decoder's fallback on scattered
    KV blocks, gpu_runtime.model.cpu_decode)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    kept = [m.weight.data for m in linears]
    with torch.no_grad():
        for module in linears:
            module.weight.data = module.weight.data.contiguous()
    try:
        yield
    finally:
        for module, data in zip(linears, kept, strict=True):
            module.weight.data = data


def load_hf(path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM  # dev dependency; only the benchmark needs it

    gguf = Path(path)
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def hf_decode_ms(model: nn.Module, prompt: list[int], max_tokens: int) -> float:
    ids = torch.tensor([prompt])

    def timed(new_tokens: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False)
        return time.perf_counter() - start

    timed(2)  # warm-up
    return (timed(max_tokens) - timed(1)) / (max_tokens - 1) * 1e3


def find_llama_cpp() -> tuple[llama_cpp_peer.LlamaCpp | None, str]:
    try:
        return llama_cpp_peer.find()
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"llama-server does not start: {error}"


@contextmanager
def llama_cpp_batch1(peer: llama_cpp_peer.LlamaCpp | None, path: str, threads: int) -> Iterator[str | None]:
    if peer is None:
        yield None
        return
    with llama_cpp_peer.server(peer, peer.f32(Path(path)), threads, slots=1, context=PREFILL_TOKENS[-1] + 64
                               ) as url:
        yield url


@contextmanager
def llama_cpp_q8(peer: llama_cpp_peer.LlamaCpp | None, path: str, threads: int) -> Iterator[str | None]:
    """llama.cpp on the GGUF file requantized to Q8_0 (8.5 bits a weight): the peer of our int8 weights."""
    if peer is None:
        yield None
        return
    q8 = peer.quantize(peer.f32(Path(path)), llama_cpp_peer.CACHE / "SmolLM2-135M-Instruct.Q8_0.gguf", "Q8_0")
    with llama_cpp_peer.server(peer, q8, threads, slots=1, context=1024) as url:
        yield url


def prefill_prompt(num_tokens: int, salt: int) -> list[int]:
    """A prompt of num_tokens ids that no earlier prompt shares a block with (no prefix-cache hit on either side)."""
    return [1000 + (salt * 7919 + i * 31) % 40000 for i in range(num_tokens)]


def engine_prefill_tokens_per_s(engine: LLMEngine, prompt: list[int]) -> float:
    """Prompt tokens per second from add_request to the first token (one step when the prompt fits the budget)."""
    start = time.perf_counter()
    engine.add_request(f"prefill-{time.monotonic_ns()}", prompt,
                       SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return len(prompt) / (time.perf_counter() - start)


def llama_cpp_same_greedy(engine: LLMEngine, url: str, prompt: list[int], max_tokens: int = 32) -> dict[str, Any]:
    """Both sides' greedy continuation of the decode prompt: equal tokens say llama.cpp serves the same weights
    (the Q4_1 file's values in F32 on both sides); fp32 sums in another order may part after many tokens."""
    ours = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))[0]
    theirs = llama_cpp_peer.greedy_tokens(url, prompt, max_tokens)
    equal = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours),
                                                                                                len(theirs)))
    return {"tokens": max_tokens, "equal_prefix_tokens": equal}


def llama_cpp_ms(url: str, prompt: list[int], max_tokens: int) -> float:
    return llama_cpp_peer.decode_ms_per_token(url, prompt, max_tokens)


def profile_decode(engine: LLMEngine, prompt: list[int], steps: int = 8) -> list[dict[str, Any]]:
    """Where a batch-1 decode step spends its time: the top ops by self CPU time, as shares of all ops."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request(f"profile-{time.monotonic_ns()}", prompt,
                       SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True))
    engine.step()  # prefill, outside the profile
    profiled = 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        while engine.has_unfinished_requests():
            engine.step()
            profiled += 1
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls_per_step": round(e.count / profiled)}
            for e in events[:6]]


def _run_one(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """Greedy output of one request and its decode tokens/s (from the first output token to the last)."""
    rid = f"spec-{time.monotonic_ns()}"
    engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    tokens: list[int] = []
    first = last = 0.0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid and out.new_token_ids:
                now = time.perf_counter()
                first = first or now
                last = now
                tokens.extend(out.new_token_ids)
    return tokens, (len(tokens) - 1) / (last - first)


def speculation(engine: LLMEngine, config: dict[str, Any], max_tokens: int, rounds: int,
                fresh: LLMEngine | None = None) -> list[dict[str, Any]]:
    """n-gram speculation on and off, alternating, on a chat answer that copies its prompt and on a free one.
    `fresh`: an engine on the same file that served nothing before; every plain output is checked against its own,
    so an engine whose state the phases before had changed is reported as such, not taken for speculation's effect
    (it caught the C batch-1 decoder reading freed memory after `row_major`'s round trip: every free-text draft was
    accepted and the repetitive answer changed; gpu_runtime.model.cpu_decode.DecoderWatch)."""
    template = ChatTemplate.from_model(Path(engine.config.model))
    rows = []
    for name, request in (("repetitive", REPETITIVE_REQUEST), ("free", FREE_REQUEST)):
        prompt = engine.tokenizer.encode(template.render([ChatMessage(role="user", content=request)]))
        expected = None if fresh is None else _run_one(fresh, prompt, max_tokens)[0]
        plain_as_fresh = True
        plain: list[float] = []
        spec: list[float] = []
        drafted = accepted = 0
        same = True
        for _ in range(rounds):
            engine.set_speculative(None)
            reference, rate = _run_one(engine, prompt, max_tokens)
            plain.append(rate)
            engine.set_speculative(config)
            before = engine.stats()
            output, rate = _run_one(engine, prompt, max_tokens)
            after = engine.stats()
            spec.append(rate)
            drafted += after.spec_num_draft_tokens - before.spec_num_draft_tokens
            accepted += after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
            same = same and output == reference
            plain_as_fresh = plain_as_fresh and reference == expected
        engine.set_speculative(None)
        rows.append({"text": name, "prompt_tokens": len(prompt),
                     "plain_output_as_fresh_engine": None if expected is None else plain_as_fresh,
                     "tokens_per_s_plain": round(statistics.median(plain), 2),
                     "tokens_per_s_speculative": round(statistics.median(spec), 2),
                     "speedup": round(statistics.median(spec) / statistics.median(plain), 2),
                     "acceptance": round(accepted / drafted, 3) if drafted else None,
                     "draft_tokens": drafted, "greedy_output_unchanged": same})
    return rows


def int8_fp32_head(engine: LLMEngine) -> LLMEngine:
    """The engine switched to int8 decoder layers with the embedding and output head kept in fp32 (the int8 scheme
    before gpu_runtime.quant.int8_blocks), from the checkpoint."""
    requantize(engine.runner.model, "int8", lambda _: engine.runner.reload_weights(), quantize_embeddings=False)
    return engine


def int8_quality(fp32: LLMEngine, int8: LLMEngine, max_tokens: int,
                 fp32_head: LLMEngine | None = None) -> dict[str, Any]:
    """Greedy answers of the quality gate's probe set, int8 against fp32: token agreement and identical answers.
    All probes at once (batched steps: the layers through torch's int8 kernel on bf16 activations, the head in C),
    and one at a time (batch-1 steps) through the C kernels (fp32 activations) and through the PyTorch path; with
    `fp32_head`, the same for int8 with the head in fp32 (before), all at once and one at a time."""
    template = ChatTemplate.from_model(Path(fp32.config.model))
    prompts = [fp32.tokenizer.encode(template.render([ChatMessage(**m) for m in p.messages()])) for p in PROBES]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    reference = fp32.generate(prompts, params)
    one_at_a_time = [int8.generate([p], params)[0] for p in prompts]
    with pytorch_path():
        one_at_a_time_before = [int8.generate([p], params)[0] for p in prompts]
    result = {**_agreement(reference, int8.generate(prompts, params), max_tokens),
              "batch1": _agreement(reference, one_at_a_time, max_tokens),
              "batch1_pytorch_path": _agreement(reference, one_at_a_time_before, max_tokens)}
    if fp32_head is not None:
        result["fp32_head"] = _agreement(reference, fp32_head.generate(prompts, params), max_tokens)
        result["fp32_head_batch1"] = _agreement(reference, [fp32_head.generate([p], params)[0] for p in prompts],
                                                max_tokens)
    return result


def _agreement(reference: list[list[int]], candidate: list[list[int]], max_tokens: int) -> dict[str, Any]:
    matching = total = 0
    prefixes = []
    for ref, cand in zip(reference, candidate, strict=True):
        matching += sum(a == b for a, b in zip(ref, cand, strict=False))
        total += max(len(ref), len(cand))
        prefixes.append(next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b),
                             min(len(ref), len(cand))))
    return {"probes": len(PROBES), "quality_tokens": max_tokens,
            "token_agreement": round(matching / total, 3),
            "identical_answers": sum(r == c for r, c in zip(reference, candidate, strict=True)),
            "mean_tokens_to_first_divergence": round(statistics.mean(prefixes), 1)}


def machine(loads: tuple[tuple[float, ...], tuple[float, ...]], threads: int) -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "unknown")
    return {"cpu_model": model, "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": threads,
            "python": platform.python_version(), "load_average_start": [round(v, 2) for v in loads[0]],
            "load_average_end": [round(v, 2) for v in loads[1]], "numpy_blas": cpu_blas.numpy_blas_ready(),
            "huge_pages": {"THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                           "anon_huge_page_bytes": _anon_huge_page_bytes()}}


def _anon_huge_page_bytes() -> int | None:
    """This process' memory in transparent huge pages: what the kernel granted, not what was asked."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            line = next(ln for ln in rollup if ln.startswith("AnonHugePages:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024
