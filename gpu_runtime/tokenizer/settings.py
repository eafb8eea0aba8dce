"""What a tokenizer brings besides its vocabulary: special tokens, whether to prepend BOS, the chat template.
Both a checkpoint directory (tokenizer.files) and a GGUF file (tokenizer.gguf) produce one; a module of its own so
that neither reader imports the other's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerSettings:
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None
    add_bos_token: bool = False
