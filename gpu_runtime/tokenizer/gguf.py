"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer`, plus its special tokens and template.

GGUF stores no tokenizer.json, only llama.cpp's pieces: `tokenizer.ggml.tokens`, `.merges` or `.scores`,
`.token_type` and the special token ids. Two kinds of vocabulary, as transformers' converter rebuilds them
(integrations/gguf/gguf_tokenizer_mapping.py), so the ids equal what transformers produces from the same file:
- byte-level BPE (`tokenizer.ggml.model == "gpt2"`: SmolLM2, Llama 3, Qwen2): byte_level_tokenizer, set_split_regex;
- SentencePiece BPE (`"llama"`: Llama 2, Mistral 7B, TinyLlama): the vocabulary and merges of transformers'
  sentencepiece_tokenizer, with the spaces placed as llama.cpp and the sentencepiece library place them
  (tests/runtime/test_gguf_sentencepiece.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from gpu_runtime.checkpoint.gguf.reader import GGUFFile
from gpu_runtime.tokenizer.settings import TokenizerSettings

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


def backend(file: GGUFFile) -> HFTokenizer:
    """The file's vocabulary as a `tokenizers.Tokenizer`, its control tokens special and kept whole."""
    kind = file.get("tokenizer.ggml.model")
    tokens = [str(t) for t in file.require("tokenizer.ggml.tokens")]  # type: ignore[attr-defined]
    if kind == "gpt2":
        tok, spelled = _byte_level(file, tokens)
    elif kind == "llama":
        tok, spelled = _sentencepiece(file, tokens), None
    else:
        raise ValueError(f"{file.path}: GGUF tokenizer {kind!r} is not supported; supported: gpt2 (byte-level BPE), "
                         "llama (SentencePiece BPE)")
    types = list(file.get("tokenizer.ggml.token_type") or [])  # type: ignore[call-overload]
    vocab = tok.get_vocab()
    # Control tokens (<|im_start|>, <s>) stay whole and are skipped when decoding; in a byte-level vocabulary a
    # "control" token spelled outside the byte alphabet is a llama.cpp mislabel that transformers skips too.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, types, strict=False)
                            if kind == _CONTROL and (spelled is None or set(t) <= spelled)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types, strict=False) if kind == _USER_DEFINED and t in vocab])
    return tok


def _byte_level(file: GGUFFile, tokens: list[str]) -> tuple[HFTokenizer, set[str]]:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token outside the byte alphabet is stored as plain text: spell it in bytes as the merges do.
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i for i, t in enumerate(tokens)}
    merges = [tuple(str(m).split(" ")) for m in file.require("tokenizer.ggml.merges")]  # type: ignore[attr-defined]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))  # type: ignore[arg-type]
    split = _SPLITS.get(str(file.get("tokenizer.ggml.pre")))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok.pre_tokenizer = byte_level if split is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    return tok, alphabet


def _sentencepiece(file: GGUFFile, tokens: list[str]) -> HFTokenizer:
    """Text spelled with '▁' for spaces (one in front, unless the file says not), merged as SentencePiece BPE
    merges, and any character outside the vocabulary as its UTF-8 bytes (`<0xE2>`), as sentencepiece does."""
    vocab = {t: i for i, t in enumerate(tokens)}
    stored = file.get("tokenizer.ggml.merges")
    scores = file.get("tokenizer.ggml.scores")
    if stored:
        merges = [tuple(str(m).split(" ")) for m in stored]  # type: ignore[union-attr]
    elif scores is not None:
        merges = _merges_from_scores(vocab, [float(s) for s in scores])  # type: ignore[union-attr]
    else:
        raise ValueError(f"{file.path}: a SentencePiece vocabulary needs tokenizer.ggml.scores or .merges")
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True))  # type: ignore[arg-type]
    prefix = bool(file.get("tokenizer.ggml.add_space_prefix", True))
    # The space goes in front of every run of text, also one that starts with a space and one after a special token,
    # as llama.cpp and sentencepiece do (and Meta's reference, which encodes each turn on its own). transformers 5's
    # LlamaTokenizer (Metaspace, prepend_scheme="first") adds none before a leading space: "  x" gets one id fewer.
    spaces = normalizers.Replace(" ", "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), spaces]) if prefix else spaces
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE stores no merges: a piece learned earlier has the higher score, so every split of a piece
    into two pieces of the vocabulary is a merge ranked by that score (transformers' generate_merges: ties by the
    left and then right part's length, longest first, then by their ids)."""
    found: list[tuple[float, int, int, str, str]] = []
    for piece, piece_id in vocab.items():
        splits = [(piece[:cut], piece[cut:]) for cut in range(1, len(piece))]
        for left, right in sorted((lr for lr in splits if lr[0] in vocab and lr[1] in vocab),
                                  key=lambda lr: (vocab[lr[0]], vocab[lr[1]])):
            found.append((scores[piece_id], len(left), len(right), left, right))
    found.sort(key=lambda m: m[:3], reverse=True)  # stable: equal keys keep the vocabulary's order
    return [(left, right) for *_, left, right in found]


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
        # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say (Llama 2-era converters).
        add_bos_token=bool(file.get("tokenizer.ggml.add_bos_token", file.get("tokenizer.ggml.model") == "llama")),
    )
