"""Where a model keeps its tokenizer: the backend (`tokenizers.Tokenizer`) and the settings around it (special
tokens, whether to prepend BOS, the chat template), read from a checkpoint directory or a GGUF file.

A Hugging Face directory has tokenizer.json and tokenizer_config.json; transformers 5 saves the chat template as
chat_template.jinja beside them instead of inside tokenizer_config.json, and that file wins when both exist, as in
transformers. A template may also be a list of named templates, of which "default" is the one chat uses.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from gpu_runtime.checkpoint.files import check_model_path
from gpu_runtime.checkpoint.gguf.reader import open_gguf
from gpu_runtime.tokenizer.gguf import backend, tokenizer_settings
from gpu_runtime.tokenizer.settings import TokenizerSettings


def _token_content(value: object) -> str | None:
    """A special token in tokenizer_config.json is a string or an AddedToken dict with `content`."""
    if isinstance(value, dict):
        return str(value.get("content"))
    return None if value is None else str(value)


def _config_template(template: object) -> str | None:
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def directory_settings(path: Path) -> TokenizerSettings:
    """From tokenizer_config.json and chat_template.jinja; either may be missing."""
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    jinja = path / "chat_template.jinja"
    template = jinja.read_text() if jinja.is_file() else _config_template(cfg.get("chat_template"))
    return TokenizerSettings(bos_token=_token_content(cfg.get("bos_token")),
                             eos_token=_token_content(cfg.get("eos_token")),
                             chat_template=template or None, add_bos_token=bool(cfg.get("add_bos_token", False)))


def read_tokenizer(path: Path) -> tuple[HFTokenizer, TokenizerSettings]:
    path = Path(path)
    check_model_path(path)
    if path.is_dir():
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise ValueError(f"model directory {path} has no tokenizer.json")
        return HFTokenizer.from_file(str(tokenizer_json)), directory_settings(path)
    file = open_gguf(path)
    return backend(file), tokenizer_settings(file)


def read_tokenizer_settings(path: Path) -> TokenizerSettings:
    """The settings alone (no backend): what the chat endpoint needs. A directory need not hold any file."""
    path = Path(path)
    if path.is_dir():
        return directory_settings(path)
    return tokenizer_settings(open_gguf(path))
