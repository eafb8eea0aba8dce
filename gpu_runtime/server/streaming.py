"""Server-sent events framing of OpenAI streaming responses (docs/facts.md#api).

Each event is `data: <json>\\n\\n` and a stream ends with `data: [DONE]\\n\\n`. One `ChunkEncoder` per request
pre-encodes the fields every chunk repeats (id, object, created, model), so a token costs one JSON string escape
instead of a full model dump: at 32 streams the event loop formats thousands of chunks per second.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

DONE_EVENT = b"data: [DONE]\n\n"


class StreamKind(StrEnum):
    COMPLETION = "text_completion"
    CHAT = "chat.completion.chunk"


def sse_event(payload: str) -> bytes:
    """One SSE event carrying a JSON document (which never contains a raw newline: json escapes them)."""
    return b"data: " + payload.encode() + b"\n\n"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class ChunkEncoder:
    """Formats the chunks of one streamed response."""

    request_id: str
    model: str
    kind: StreamKind
    created: int = field(default_factory=lambda: int(time.time()))

    @cached_property
    def _head(self) -> str:
        return f'{{"id":{_json(self.request_id)},"object":"{self.kind.value}","created":{self.created},' \
               f'"model":{_json(self.model)}'

    def role(self) -> bytes:
        """The first chat chunk announces the assistant role (as OpenAI does); completions have none."""
        return sse_event(f'{self._head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                         f'"logprobs":null,"finish_reason":null}}]}}')

    def text(self, text: str, finish_reason: str | None, logprobs: str | None = None) -> bytes:
        """logprobs: the chunk's logprobs object, already JSON (None: null)."""
        reason, logprobs = _json(finish_reason), logprobs or "null"
        if self.kind is StreamKind.CHAT:
            choice = f'{{"index":0,"delta":{{"content":{_json(text)}}},"logprobs":{logprobs},"finish_reason":{reason}}}'
        else:
            choice = f'{{"index":0,"text":{_json(text)},"logprobs":{logprobs},"finish_reason":{reason}}}'
        return sse_event(f'{self._head},"choices":[{choice}]}}')

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The extra chunk `stream_options.include_usage` asks for: empty choices, token counts."""
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        return sse_event(f'{self._head},"choices":[],"usage":{_json(usage)}}}')

    @staticmethod
    def error(message: str, type_: str, code: str | None = None) -> bytes:
        """An error after the stream started (status already sent): vLLM and OpenAI send it as an event."""
        return sse_event(_json({"error": {"message": message, "type": type_, "code": code}}))
