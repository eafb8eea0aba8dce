"""GGUF files with a SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral 7B, TinyLlama).

llama.cpp's converter stores such a vocabulary as pieces, scores and token types, without merges. The reference is
independent of our code: the sentencepiece library that trained the vocabulary (ids and text), which places spaces
as llama.cpp does (transformers 5 does not: it adds no space in front of a text that starts with one). The
vocabulary is trained here, with Llama's trainer settings, on text built here: nothing is downloaded.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import openai
import pytest
import sentencepiece as spm
from gguf import GGUFWriter, TokenType

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.harness.runtime import RuntimeServer
from tests.runtime.gguf_builder import write_gguf

VOCAB_SIZE = 512  # the nano checkpoint's
TEXTS = ["Hello, world!", "The capital of France is Paris.", "  two leading spaces,  and   inner ones ",
         "line one\nline two\n\n\ttabbed", "numbers 1234567 and 3.14159", "café naïve résumé", "日本語 🙂 ✓ Ω",
         "", " ", "(parenthesis) [brackets] {braces}"]
# Llama 2's chat template in short: it writes BOS itself, as most templates do.
LLAMA2_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                   "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
_WORDS = ["the", "capital", "of", "france", "is", "paris", "a", "city", "river", "model", "token", "piece", "serving",
          "latency", "batch", "decode", "prefill", "café", "naïve", "résumé", "world", "hello", "line", "two", "one"]


def _corpus() -> list[str]:
    rng = random.Random(7)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14))) for _ in range(3000)]
    lines += [" ".join("".join(rng.choice("bcdfglmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 3)))
                       for _ in range(10)) for _ in range(3000)]
    return lines + [f"{n} items cost {n * 7 % 100}.{n % 10} each" for n in range(500)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> spm.SentencePieceProcessor:
    """A BPE vocabulary trained as Llama's was (identity normalization, byte fallback, split digits, spaces kept)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=model, model_type="bpe", vocab_size=VOCAB_SIZE,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        character_coverage=0.9995, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _vocabulary(sp: spm.SentencePieceProcessor):
    """The metadata llama.cpp's converter writes for a SentencePiece model (convert_hf_to_gguf.py
    _create_vocab_sentencepiece): pieces, scores, types; BOS added; no merges."""

    def write(writer: GGUFWriter) -> None:
        kinds = []
        for i in range(sp.get_piece_size()):
            kinds.append(TokenType.CONTROL if sp.is_control(i) else TokenType.UNKNOWN if sp.is_unknown(i)
                         else TokenType.BYTE if sp.is_byte(i) else TokenType.UNUSED if sp.is_unused(i)
                         else TokenType.NORMAL)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
        writer.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
        writer.add_token_types(kinds)
        writer.add_bos_token_id(sp.bos_id())
        writer.add_eos_token_id(sp.eos_id())
        writer.add_unk_token_id(sp.unk_id())
        writer.add_chat_template(LLAMA2_TEMPLATE)

    return write


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory, trained: spm.SentencePieceProcessor) -> Path:
    assert trained.get_piece_size() == VOCAB_SIZE
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("nano"), preset="nano", arch="llama")
    return write_gguf(checkpoint, tmp_path_factory.mktemp("spm") / "nano-spm.gguf", vocabulary=_vocabulary(trained))


def test_ids_and_text_equal_sentencepiece(model_file: Path, trained: spm.SentencePieceProcessor) -> None:
    ours = Tokenizer(model_file)
    assert (ours.bos_token, ours.eos_token, ours.add_bos_token) == ("<s>", "</s>", True)
    byte_fallback = 0
    for text in TEXTS:
        expected = [trained.bos_id(), *trained.encode(text)]
        assert ours.encode(text) == expected, (text, [trained.id_to_piece(i) for i in ours.encode(text)])
        assert ours.decode(expected) == trained.decode(expected[1:]), text
        byte_fallback += sum(trained.is_byte(i) for i in expected)
    assert byte_fallback >= 10  # the characters the vocabulary lacks went through their UTF-8 bytes


def test_text_after_a_special_token_is_encoded_as_a_text_of_its_own(model_file: Path,
                                                                      trained: spm.SentencePieceProcessor) -> None:
    """As llama.cpp does with special tokens in a prompt, and Meta's chat reference, which encodes each turn alone
    and joins them with BOS/EOS ids: the text after `</s><s>` gets its leading space like any text."""
    ours = Tokenizer(model_file)
    first, second = "[INST] hello [/INST] answer ", "[INST] again [/INST]"
    expected = [trained.bos_id(), *trained.encode(first), trained.eos_id(), trained.bos_id(), *trained.encode(second)]
    assert ours.encode(f"{first}</s><s>{second}") == expected
    assert ours.decode(expected) == trained.decode(expected)


def test_streamed_text_keeps_the_space_before_the_first_output_word(model_file: Path,
                                                                    trained: spm.SentencePieceProcessor) -> None:
    """An output decoded alone loses the space in front of its first word (a SentencePiece decoder strips it); the
    stream starts from the prompt's last ids instead, so prompt + output reads as sentencepiece decodes it."""
    ours = Tokenizer(model_file)
    prompt, output = trained.encode("The capital of France is"), trained.encode("The capital of France is Paris 日本")
    output = output[len(prompt):]
    assert trained.id_to_piece(output[0]).startswith("▁")
    detokenizer = IncrementalDetokenizer(ours, prompt[-5:])
    deltas = [detokenizer.step(output[: n + 1]) for n in range(len(output))]
    assert "".join(deltas) == " Paris 日本" == trained.decode(prompt + output)[len(trained.decode(prompt)):]
    assert "" in deltas  # a character split over byte tokens waited for its last byte


def test_the_engine_serves_the_file_and_its_text_is_the_tokens(model_file: Path,
                                                              trained: spm.SentencePieceProcessor) -> None:
    engine = LLMEngine(EngineConfig(model=str(model_file), device="cpu", dtype="float32"))
    prompt = engine.tokenizer.encode("The capital of France is")
    # Bytes and control tokens banned: random weights would emit stray UTF-8 bytes that no decoder agrees on.
    banned = tuple((i, -100.0) for i in range(VOCAB_SIZE) if trained.is_byte(i) or trained.is_control(i))
    engine.add_request("r", prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                                                   logit_bias=banned))
    ids: list[int] = []
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            ids += out.new_token_ids
            text += out.new_text
    assert len(ids) == 16
    assert text == trained.decode(prompt[1:] + ids)[len(trained.decode(prompt[1:])):]


def test_a_tokens_text_in_logprobs_keeps_its_space(model_file: Path, trained: spm.SentencePieceProcessor) -> None:
    """Logprobs name each token by its text; decoded alone, "▁Paris" would read "Paris", so the texts of a
    completion's tokens would not add up to its text, and "▁Paris" and "Paris" would collide in top_logprobs."""
    ours = Tokenizer(model_file)
    ids = trained.encode("The capital of France is Paris")
    assert "".join(ours.token_text(i) for i in ids) == " The capital of France is Paris"
    assert ours.token_text(trained.piece_to_id("▁is")) == " is" and ours.token_text(trained.eos_id()) == "</s>"
    assert ours.token_text(trained.piece_to_id("<0xE6>")) == "\ufffd"  # part of a character, as vLLM shows it


def test_a_chat_prompt_starts_with_one_bos(model_file: Path, trained: spm.SentencePieceProcessor,
                                           tmp_path: Path) -> None:
    """The template writes BOS; the file asks for BOS too. Chat adds none on top (vLLM's add_special_tokens=False),
    a completion of the same text does, as in vLLM and llama.cpp."""
    server = RuntimeServer(model_file, tmp_path)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello there"}],
                                              max_tokens=1)
        rendered = trained.encode("[INST] hello there [/INST]")
        assert chat.usage.prompt_tokens == 1 + len(rendered)
        text = client.completions.create(model="tiny", prompt="<s>[INST] hello there [/INST]", max_tokens=1)
        assert text.usage.prompt_tokens == 2 + len(rendered)
        more = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello there"}],
                                              max_tokens=1, extra_body={"add_special_tokens": True})
        assert more.usage.prompt_tokens == 2 + len(rendered)
    finally:
        server.stop()
