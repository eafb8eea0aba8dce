"""The checkpoint's tokenizer (tokenizer.json via `tokenizers`, special tokens and chat template from
tokenizer_config.json) and incremental detokenization for streaming.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


def _token_content(value: object) -> str | None:
    if isinstance(value, dict):
        return str(value.get("content"))
    return None if value is None else str(value)


class Tokenizer:
    """encode/decode plus eos_token_id, bos_token_id and chat_template (None when the checkpoint has none)."""

    def __init__(self, path: Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        path = Path(path)
        self._tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        self.chat_template: str | None = cfg.get("chat_template")
        self.bos_token: str | None = _token_content(cfg.get("bos_token"))
        self.eos_token: str | None = _token_content(cfg.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        eos_from_cfg = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_id: int | None = (
            eos_from_cfg if eos_from_cfg is not None else (eos_token_ids[0] if eos_token_ids else None)
        )
        ids = {*eos_token_ids, *([self.eos_token_id] if self.eos_token_id is not None else [])}
        self.eos_token_ids: frozenset[int] = frozenset(ids)
        self.add_bos_token = bool(cfg.get("add_bos_token", False))

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


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas without re-emitting or splitting multi-byte characters.

    Decodes a short window (prefix_offset..) and emits what it adds beyond the already emitted part of that window;
    holds back text ending in U+FFFD (an incomplete UTF-8 sequence), the approach of vLLM/TGI's detokenizers.
    """

    tokenizer: Tokenizer
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = field(default="")

    def step(self, ids: list[int]) -> str:
        """ids: all output ids so far; returns the new text they add."""
        prefix_text = self.tokenizer.decode(ids[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.decode(ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.text += delta
        return delta
