"""Turns chat messages into the prompt text the model was trained on.

The template comes from the checkpoint's tokenizer_config.json (`chat_template`, a Jinja2 string or a list of named
templates, rendered as Hugging Face does: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`), in a
sandboxed environment because a checkpoint is untrusted input. Without one, a plain "role: content" transcript is the
fallback, so any Llama-family checkpoint can chat.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gpu_runtime.server.protocol import APIError, ChatMessage


def _token_text(token: object) -> str:
    """A special token in tokenizer_config.json is a string or an AddedToken dict with `content`."""
    if isinstance(token, dict):
        return str(token.get("content", ""))
    return "" if token is None else str(token)


def _raise_template_error(message: str) -> None:
    raise APIError(400, f"chat template refused the messages: {message}")


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template, or the plain fallback when `source` is None."""

    source: str | None
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ChatTemplate:
        config_path = model_dir / "tokenizer_config.json"
        if not config_path.is_file():
            return cls(source=None)
        config = json.loads(config_path.read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
            named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return cls(source=template if isinstance(template, str) and template else None,
                   bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")))

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
