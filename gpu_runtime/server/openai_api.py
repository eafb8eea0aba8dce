"""The OpenAI-compatible endpoints: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

A request is validated (protocol.py), tokenized, turned into the engine's `SamplingParams` and submitted through the
`AsyncEngine`; the answer is either streamed as SSE (streaming.py) or collected into one response. A client that
disconnects, streaming or not, cancels the consuming task, which aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gpu_runtime.config import SamplingParams
from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.server.async_engine import AsyncEngine, EngineDeadError, RequestStream
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.logprobs_format import LogprobFormatter
from gpu_runtime.server.protocol import (
    APIError,
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
)
from gpu_runtime.server.streaming import DONE_EVENT, ChunkEncoder, StreamKind

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int
    vocab_size: int
    chat_template: ChatTemplate


@dataclass(frozen=True)
class Collected:
    text: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list[TokenLogprob]


# Streamed logprobs: (the chunk's token logprobs, characters of text already sent) -> the chunk's "logprobs" JSON.
LogprobsRenderer = Callable[[list[TokenLogprob], int], str]


class OpenAIHandlers:
    """Request -> engine -> response for one served model."""

    def __init__(self, engine: AsyncEngine, model: ServedModel) -> None:
        self.engine = engine
        self.model = model
        self.logprobs = LogprobFormatter(engine.engine.tokenizer)

    def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self.model.name, max_model_len=self.model.max_model_len)])

    async def completion(self, body: CompletionRequest, request: Request) -> Response | CompletionResponse:
        self._check_model(body.model)
        prompt_ids = self._prompt_ids(body.prompt)
        params = self._params(body, prompt_ids, body.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        outputs = await self.engine.submit(request_id, prompt_ids, params)
        wants_logprobs = body.num_logprobs is not None
        if body.stream:
            encoder = ChunkEncoder(request_id, self.model.name, StreamKind.COMPLETION)
            render = self.logprobs.completion_json if wants_logprobs else None
            return _streaming_response(outputs, encoder, body.include_usage, render)
        result = await _collect_unless_disconnected(outputs, request)
        logprobs = self.logprobs.completion(result.logprobs) if wants_logprobs else None
        return CompletionResponse(
            id=request_id, model=self.model.name,
            choices=[CompletionChoice(text=result.text, finish_reason=result.finish_reason, logprobs=logprobs)],
            usage=Usage.of(result.num_prompt_tokens, result.num_output_tokens))

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response | ChatCompletionResponse:
        self._check_model(body.model)
        prompt = self.model.chat_template.render(body.messages, body.add_generation_prompt,
                                                 body.continue_final_message, body.chat_template_kwargs)
        prompt_ids = self._prompt_ids(prompt, body.add_special_tokens)  # a template writes its own BOS (vLLM's rule)
        # Chat defaults to the rest of the context, as vLLM does.
        params = self._params(body, prompt_ids, body.output_limit or self.model.max_model_len - len(prompt_ids))
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        outputs = await self.engine.submit(request_id, prompt_ids, params)
        wants_logprobs = body.num_logprobs is not None
        if body.stream:
            encoder = ChunkEncoder(request_id, self.model.name, StreamKind.CHAT)
            render = self.logprobs.chat_json if wants_logprobs else None
            return _streaming_response(outputs, encoder, body.include_usage, render)
        result = await _collect_unless_disconnected(outputs, request)
        logprobs = self.logprobs.chat(result.logprobs) if wants_logprobs else None
        return ChatCompletionResponse(
            id=request_id, model=self.model.name,
            choices=[ChatChoice(message=AssistantMessage(content=result.text), finish_reason=result.finish_reason,
                                logprobs=logprobs)],
            usage=Usage.of(result.num_prompt_tokens, result.num_output_tokens))

    def _check_model(self, name: str) -> None:
        if name != self.model.name:
            raise APIError(404, f"The model `{name}` does not exist.", type_="NotFoundError", code="model_not_found")

    def _prompt_ids(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        tokenizer = self.engine.engine.tokenizer
        ids = tokenizer.encode(prompt, add_special_tokens) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise APIError(400, "prompt is empty after tokenization")
        if any(not 0 <= token < self.model.vocab_size for token in ids):
            raise APIError(400, f"prompt token ids must be in [0, {self.model.vocab_size})")
        return ids

    def _params(self, body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
                max_tokens: int) -> SamplingParams:
        if len(prompt_ids) + max_tokens > self.model.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.model.max_model_len} tokens; the "
                                f"prompt has {len(prompt_ids)} and max_tokens asks for {max_tokens} more.",
                           code="context_length_exceeded")
        if any(not 0 <= token < self.model.vocab_size for token, _ in body.logit_bias_pairs):
            raise APIError(400, f"logit_bias token ids must be in [0, {self.model.vocab_size})")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                  top_k=max(0, body.top_k), seed=body.seed, stop=body.stop_strings,
                                  stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos,
                                  logprobs=body.num_logprobs, min_tokens=body.min_tokens,
                                  logit_bias=body.logit_bias_pairs)
        except ValueError as error:
            raise APIError(400, str(error)) from error


def _streaming_response(outputs: RequestStream, encoder: ChunkEncoder, include_usage: bool,
                        render: LogprobsRenderer | None) -> Response:
    """The request is already admitted, so a refusal (429, 400) was a status code, not an event in a 200 stream."""
    return StreamingResponse(_sse(outputs, encoder, include_usage, render), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _sse(outputs: RequestStream, encoder: ChunkEncoder, include_usage: bool,
               render: LogprobsRenderer | None) -> AsyncIterator[bytes]:
    async with aclosing(outputs):  # cancellation (client gone) closes the engine stream, which aborts the request
        if encoder.kind is StreamKind.CHAT:
            yield encoder.role()
        last = None
        num_chars_sent = 0
        try:
            while not outputs.done:
                batch = await outputs.next_batch()
                last = batch[-1]
                events = []
                for o in batch:
                    # Tokens whose text is held back (a possible stop string, a split character) still carry
                    # their logprobs now: every token's logprob is sent exactly once.
                    logprobs = render(o.logprobs, num_chars_sent) if render and o.logprobs else None
                    if o.new_text or o.finished or logprobs:
                        events.append(encoder.text(o.new_text, o.finish_reason if o.finished else None, logprobs))
                    num_chars_sent += len(o.new_text)
                if events:
                    yield b"".join(events)
        except EngineDeadError as error:
            yield ChunkEncoder.error(str(error), "server_error")
        else:
            if include_usage and last is not None:
                yield encoder.usage(last.num_prompt_tokens, last.num_output_tokens)
        yield DONE_EVENT


async def _collect(outputs: RequestStream) -> Collected:
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    last = None
    async with aclosing(outputs):
        async for output in outputs:
            parts.append(output.new_text)
            logprobs.extend(output.logprobs or ())
            last = output
    assert last is not None and last.finished  # generate() yields until its request finishes
    return Collected("".join(parts), last.finish_reason, last.num_prompt_tokens, last.num_output_tokens, logprobs)


async def _collect_unless_disconnected(outputs: RequestStream, request: Request) -> Collected:
    """Collect a non-streamed answer; if the client leaves first, cancel (and so abort) the request."""
    collect = asyncio.ensure_future(_collect(outputs))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    if collect in done:
        watch.cancel()
        return collect.result()
    collect.cancel()
    raise APIError(499, "client disconnected", code="client_closed_request")


async def _wait_disconnect(request: Request) -> None:
    # The body is already read, so the next ASGI message is the client going away (no polling).
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_openai_router(handlers: OpenAIHandlers) -> APIRouter:
    router = APIRouter()
    router.add_api_route("/v1/models", handlers.models, methods=["GET"])
    router.add_api_route("/v1/completions", handlers.completion, methods=["POST"], response_model=None)
    router.add_api_route("/v1/chat/completions", handlers.chat, methods=["POST"], response_model=None)
    return router
