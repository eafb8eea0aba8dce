"""Turns chat messages into the prompt text the model was trained on.

The template comes with the model (tokenizer_config.json or chat_template.jinja of a checkpoint, the metadata of a
GGUF file; see tokenizer_files) and is rendered as Hugging Face's `apply_chat_template` renders it: the same Jinja
environment (sandboxed, since a checkpoint is untrusted input; loop controls; the `{% generation %}` tag; a `tojson`
that does not escape HTML; `raise_exception` and `strftime_now`), the same variables, and `continue_final_message`
cut the same way. The template is compiled once: compiling SmolLM2's 368 characters took 8-35 ms, on the event loop
and before every chat request's first token. Without a template, a plain "role: content" transcript is the
fallback, so any Llama-family checkpoint can chat.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gpu_runtime.server.protocol import APIError, ChatMessage
from gpu_runtime.tokenizer.files import read_tokenizer_settings

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' own marker


def _raise_template_error(message: str) -> None:
    raise APIError(400, f"chat template refused the messages: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would put \u003c into prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_: str) -> str:
    return datetime.now().strftime(format_)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: Hugging Face marks assistant turns with it for training masks;
    serving renders the body as it is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = _strftime_now
    return env


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

    @functools.cached_property
    def _compiled(self) -> jinja2.Template:
        assert self.source is not None
        return _environment().from_string(self.source)

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               continue_final_message: bool = False, extra: Mapping[str, Any] | None = None) -> str:
        """The prompt for `messages`, ending where the assistant's reply starts, or, with continue_final_message,
        inside the last message (the reply continues its text). `extra`: more template variables (vLLM's
        chat_template_kwargs); they cannot replace the ones set here."""
        if continue_final_message and add_generation_prompt:
            raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true")
        if self.source is None:
            return self._plain(messages, add_generation_prompt)
        contents = [m.text() for m in messages]
        if continue_final_message:  # cut where the last message's text ends, as transformers does: at a tag after it
            contents[-1] += _CONTINUE_TAG
        variables = dict(extra or {}) | {
            "messages": [{"role": m.role, "content": text} for m, text in zip(messages, contents, strict=True)],
            "add_generation_prompt": add_generation_prompt, "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            rendered = self._compiled.render(**variables)
        except jinja2.TemplateError as error:
            raise APIError(400, f"chat template failed: {error}") from error
        if not continue_final_message:
            return rendered
        if _CONTINUE_TAG.strip() not in rendered:
            raise APIError(400, "continue_final_message: the template does not render the last message's text")
        cut = rendered.rindex(_CONTINUE_TAG.strip())
        # A template that trims messages trimmed the tag's space too: then the message's trailing spaces are gone.
        return rendered[:cut] if rendered[cut:].startswith(_CONTINUE_TAG) else rendered[:cut].rstrip()

    @staticmethod
    def _plain(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
        lines = [f"{message.role}: {message.text()}" for message in messages]
        return "\n".join([*lines, "assistant:"] if add_generation_prompt else lines)
