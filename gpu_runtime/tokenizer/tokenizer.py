"""The model's tokenizer (a checkpoint's tokenizer.json or a GGUF file's vocabulary, via tokenizer_files) with its
special tokens and chat template, and incremental detokenization for streaming.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpu_runtime.tokenizer.files import read_tokenizer


class Tokenizer:
    """encode/decode plus eos_token_id, bos_token_id and chat_template (None when the model has none)."""

    def __init__(self, path: Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        self._tok, settings = read_tokenizer(Path(path))
        self.chat_template: str | None = settings.chat_template
        self.bos_token, self.eos_token = settings.bos_token, settings.eos_token
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        eos_from_cfg = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_id: int | None = (
            eos_from_cfg if eos_from_cfg is not None else (eos_token_ids[0] if eos_token_ids else None)
        )
        ids = {*eos_token_ids, *([self.eos_token_id] if self.eos_token_id is not None else [])}
        self.eos_token_ids: frozenset[int] = frozenset(ids)
        self.add_bos_token = settings.add_bos_token
        self._anchor: int | None = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's text as it reads inside a text, special tokens spelled out: decoded after an anchor token and
        the anchor's text cut off, since a SentencePiece decoder strips the space of a token decoded first ("▁Paris"
        reads " Paris", as vLLM renders it in logprobs). Part of a UTF-8 character reads as U+FFFD."""
        if self._anchor is None:
            self._anchor = self._tok.encode("a", add_special_tokens=False).ids[-1]
        before = self._tok.decode([self._anchor], skip_special_tokens=False)
        return self._tok.decode([self._anchor, token_id], skip_special_tokens=False)[len(before):]


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas without re-emitting or splitting multi-byte characters.

    Decodes a short window (prefix_offset..) and emits what it adds beyond the already emitted part of that window;
    holds back text ending in U+FFFD (an incomplete UTF-8 sequence), the approach of vLLM/TGI's detokenizers.
    The window starts on the prompt's last ids (`context`), as vLLM's does: a SentencePiece decoder strips the space
    in front of the first token it decodes, so the output's first word (" Paris" after "The capital is") would lose
    its space if decoded alone.
    """

    tokenizer: Tokenizer
    context: list[int] = field(default_factory=list)
    text: str = field(default="")

    def __post_init__(self) -> None:
        self.context = list(self.context)
        self.prefix_offset, self.read_offset = 0, len(self.context)

    def step(self, ids: list[int]) -> str:
        """ids: all output ids so far; returns the new text they add."""
        ids = self.context + ids
        prefix_text = self.tokenizer.decode(ids[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.decode(ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.text += delta
        return delta
