"""From sampled tokens to what a client sees: incremental detokenization, stop conditions (stop tokens, EOS, stop
strings, max_tokens, max_model_len, min_tokens) and the `RequestOutput` of each step. Text that could still become
a stop string is held back until it cannot; tokens after a stop are dropped from the sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_runtime.config import SamplingParams
from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.engine.outputs import RequestOutput
from gpu_runtime.engine.sequence import Sequence
from gpu_runtime.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer

DETOKENIZE_CONTEXT = 5  # prompt ids an output's detokenization starts from (vLLM's initial offset)


@dataclass
class _TextState:
    """Detokenized output of one request; text past `emitted` is held back while it could start a stop string."""

    detokenizer: IncrementalDetokenizer
    text: str = ""
    emitted: int = 0
    stop_holdback: int = 0
    token_times: list[float] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._texts: dict[str, _TextState] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        holdback = max((len(s) for s in params.stop), default=1) - 1
        context = prompt_token_ids[-DETOKENIZE_CONTEXT:]
        self._texts[request_id] = _TextState(IncrementalDetokenizer(self.tokenizer, context), stop_holdback=holdback)

    def process(
        self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None, now: float
    ) -> tuple[list[int], str, list[float], list[TokenLogprob] | None, str | None]:
        """Detokenize and check stop conditions token by token: (tokens kept, new text, their times, their logprobs,
        finish reason or None). Tokens after a stop are dropped from the sequence."""
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
                break
        end = len(state.text) if reason else max(state.emitted, len(state.text) - state.stop_holdback)
        new_text, state.emitted = state.text[state.emitted : end], end
        times, state.token_times = state.token_times, []
        return tokens, new_text, times, logprobs, reason

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

    def output(self, seq: Sequence, new_ids: list[int], new_text: str, token_times: list[float],
               logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        """The step's output of one request; a finished request's text state is dropped."""
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
