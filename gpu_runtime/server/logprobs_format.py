"""Engine logprobs (`TokenLogprob`) in OpenAI's two wire shapes, as vLLM renders them.

Completions use the legacy shape (tokens, token_logprobs, top_logprobs as text -> logprob with the sampled token
included, text_offset); chat uses `content: [{token, logprob, bytes, top_logprobs: [...]}]` with the top
alternatives only. A token's text is what it adds inside a text, special tokens kept (`Tokenizer.token_text`),
so a token holding part of a UTF-8 character reads as U+FFFD, as in vLLM. -inf (a token a logits row rules out)
becomes -9999.0 as in vLLM, since JSON has no infinity.
"""

from __future__ import annotations

import math

from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from gpu_runtime.tokenizer.tokenizer import Tokenizer

_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, _FLOOR) if not math.isnan(logprob) else _FLOOR


class LogprobFormatter:
    """Renders logprobs for one served model; token texts are decoded once and remembered."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.token_text(token_id)
        return text

    def completion(self, entries: list[TokenLogprob], text_offset: int = 0) -> CompletionLogprobs:
        """text_offset: characters of completion text before the first of these tokens (streaming continues it)."""
        tokens = [self.token_text(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(text_offset)
            text_offset += len(token)
        tops = []
        for token, entry in zip(tokens, entries, strict=True):
            top = {token: _finite(entry.logprob)}
            for token_id, logprob in entry.top:
                top.setdefault(self.token_text(token_id), _finite(logprob))
            tops.append(top)
        return CompletionLogprobs(tokens=tokens, token_logprobs=[_finite(e.logprob) for e in entries],
                                  top_logprobs=tops, text_offset=offsets)

    def chat(self, entries: list[TokenLogprob]) -> ChatLogprobs:
        return ChatLogprobs(content=[
            ChatTokenLogprob(**self._top(e.token_id, e.logprob).model_dump(),
                             top_logprobs=[self._top(token_id, logprob) for token_id, logprob in e.top])
            for e in entries])

    def completion_json(self, entries: list[TokenLogprob], text_offset: int) -> str:
        """A streamed chunk's logprobs; text_offset: characters of completion text sent before the chunk."""
        return self.completion(entries, text_offset).model_dump_json()

    def chat_json(self, entries: list[TokenLogprob], text_offset: int) -> str:
        """A streamed chunk's logprobs (chat has no offsets; the argument keeps one renderer signature)."""
        return self.chat(entries).model_dump_json()

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8", errors="replace")))
