"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer`, plus its special tokens and template.

GGUF stores no tokenizer.json, only llama.cpp's pieces: `tokenizer.ggml.tokens`, `.merges`, `.token_type` and the
special token ids. For a byte-level BPE vocabulary (`tokenizer.ggml.model == "gpt2"`, SmolLM2, Llama 3, Qwen2) this
mirrors transformers' converter (integrations/gguf/gguf_tokenizer_mapping.py: byte_level_tokenizer,
add_gguf_special_tokens, set_split_regex), so the ids equal what transformers produces from the same file.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from gpu_runtime.gguf_model.reader import GGUFFile
from gpu_runtime.tokenizer_files import TokenizerSettings

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split its merges were learned with; others (SmolLM2's "smollm") use GPT-2's regex.
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
           "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py), the alphabet of byte-level vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def byte_level_backend(file: GGUFFile) -> HFTokenizer:
    kind = file.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{file.path}: GGUF tokenizer {kind!r} is not supported; supported: gpt2 (byte-level BPE)")
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = [str(t) for t in file.require("tokenizer.ggml.tokens")]  # type: ignore[attr-defined]
    # A token outside the byte alphabet is stored as plain text: spell it in bytes as the merges do.
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i for i, t in enumerate(tokens)}
    merges = [tuple(str(m).split(" ")) for m in file.require("tokenizer.ggml.merges")]  # type: ignore[attr-defined]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))  # type: ignore[arg-type]
    split = _SPLITS.get(str(file.get("tokenizer.ggml.pre")))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok.pre_tokenizer = byte_level if split is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    types = list(file.get("tokenizer.ggml.token_type") or [])  # type: ignore[call-overload]
    # Control tokens (<|im_start|>) stay whole and are skipped when decoding; a "control" token spelled outside the
    # byte alphabet is a llama.cpp mislabel that transformers skips too.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, types, strict=False) if kind == _CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types, strict=False) if kind == _USER_DEFINED and t in vocab])
    return tok


def _token(file: GGUFFile, key: str) -> str | None:
    token_id = file.get(f"tokenizer.ggml.{key}")
    tokens = file.require("tokenizer.ggml.tokens")
    return None if token_id is None else str(tokens[int(token_id)])  # type: ignore[index, call-overload]


def tokenizer_settings(file: GGUFFile) -> TokenizerSettings:
    template = file.get("tokenizer.chat_template")
    return TokenizerSettings(
        bos_token=_token(file, "bos_token_id"),
        eos_token=_token(file, "eos_token_id"),
        chat_template=str(template) if template else None,
        add_bos_token=bool(file.get("tokenizer.ggml.add_bos_token", False)),
    )
