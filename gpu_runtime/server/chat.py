"""Turns chat messages into the prompt text the model was trained on.

The template comes with the model (tokenizer_config.json or chat_template.jinja of a checkpoint, the metadata of a
GGUF file; see tokenizer_files) and is rendered as Hugging Face does (`messages`, `add_generation_prompt`,
`bos_token`, `eos_token`), in a sandboxed environment because a checkpoint is untrusted input. Without one, a plain
"role: content" transcript is the fallback, so any Llama-family checkpoint can chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gpu_runtime.server.protocol import APIError, ChatMessage
from gpu_runtime.tokenizer_files import read_tokenizer_settings


def _raise_template_error(message: str) -> None:
    raise APIError(400, f"chat template refused the messages: {message}")


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template, or the plain fallback when `source` is None."""

    source: str | None
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def from_model(cls, path: Path) -> ChatTemplate:
        """The template of a checkpoint directory (tokenizer_config.json or chat_template.jinja) or a GGUF file."""
        settings = read_tokenizer_settings(Path(path))
        return cls(source=settings.chat_template, bos_token=settings.bos_token or "",
                   eos_token=settings.eos_token or "")

    def render(self, messages: list[ChatMessage]) -> str:
        """The prompt for `messages`, ending where the assistant's reply starts."""
        if self.source is None:
            return self._plain(messages)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        try:
            template = env.from_string(self.source)
            return template.render(messages=[{"role": m.role, "content": m.text()} for m in messages],
                                   add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.TemplateError as error:
            raise APIError(400, f"chat template failed: {error}") from error

    @staticmethod
    def _plain(messages: list[ChatMessage]) -> str:
        lines = [f"{message.role}: {message.text()}" for message in messages]
        return "\n".join([*lines, "assistant:"])
