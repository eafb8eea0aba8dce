"""The OpenAI-compatible wire format of the runtime's HTTP API (docs/facts.md#api).

Request models validate what a client may ask for and turn it into the engine's `SamplingParams`; response models
are what non-streaming endpoints return; `APIError` is the one exception type that becomes an OpenAI-style error
object (`{"error": {"message", "type", "code"}}`) with a 4xx status. Unknown request fields are ignored, as OpenAI and
vLLM do, but known fields this runtime cannot honour (n > 1, echo, penalties, tools, structured output) are refused
rather than dropped: a client that asked for JSON or a tool call must not get free text that looks like success.
`logprobs` follows vLLM: an integer 0..20 on completions, `logprobs: true` plus `top_logprobs` 0..20 on chat.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class APIError(Exception):
    """An error the client caused (or overload); rendered as an OpenAI error object with `status`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.retry_after_s = retry_after_s


class ErrorBody(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

    @classmethod
    def of(cls, error: APIError) -> ErrorResponse:
        return cls(error=ErrorBody(message=error.message, type=error.type, code=error.code))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Fields shared by both endpoints; ranges follow the OpenAI API reference."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0  # vLLM extension; -1 and 0 both mean off
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None  # what torch.Generator accepts
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    min_tokens: Annotated[int, Field(ge=0)] = 0  # vLLM extension (benchmark clients fix output lengths with it)
    # OpenAI: token id (as a string key) -> bias in [-100, 100]
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias and any(not key.isdigit() for key in bias):
            raise ValueError("logit_bias keys must be token ids")
        return bias

    @property
    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(token), value) for token, value in (self.logit_bias or {}).items())

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else (stop or [])
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        return stop

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    # A string, a list of token ids, or a batch of one of either (OpenAI accepts batches; this runtime serves one).
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: Literal[False] = False
    suffix: None = None
    # The sampled token's logprob plus this many alternatives; strict: `true` is the chat spelling, refused here.
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS, strict=True)] | None = None

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: str | list[str] | list[int] | list[list[int]]) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("prompt must not be empty")
        return prompt


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]  # json_object and json_schema need guided decoding, which this runtime does not have


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    # vLLM's chat template controls: the assistant header, a reply that continues the last message, template options
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, object] | None = None
    # vLLM's: BOS and the like on top of the template's own; off, since templates write their BOS themselves
    add_special_tokens: bool = False

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @model_validator(mode="after")
    def _no_tool_calls(self) -> ChatCompletionRequest:
        # vLLM, too, refuses tools unless a tool-call parser is configured; this runtime has none.
        if self.tools and self.tool_choice != "none":
            raise ValueError("tool calling is not supported by this runtime (send no tools, or tool_choice 'none')")
        return self

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: per token its text, logprob, top alternatives (text -> logprob, the sampled
    token included) and character offset in the completion text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "slotune"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
