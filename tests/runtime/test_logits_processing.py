"""min_tokens and logit_bias inside LLMEngine: a stop cannot be sampled, nor accepted from a speculative draft,
before min_tokens; a bias moves what is drawn but the logprobs sent back stay the model's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.speculative.checkpoints import build_successor_model, cycle_successor
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings

CYCLE = list(range(300, 340))
STOP = 305  # greedy reaches it as the 6th output token of CYCLE * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("logits_tiny") / "tiny", preset="tiny")


@pytest.fixture(scope="module")
def successor(tiny: Path) -> Path:
    return build_successor_model(tiny, tiny.parent / "successor", cycle_successor(2048, CYCLE))


def _engine(path: Path, spec: SpeculativeSettings | None = None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=8 << 20, knobs=SchedulerKnobs(),
                                  speculative=spec))


@pytest.mark.parametrize("spec", [None, SpeculativeSettings(SpecMethod.NGRAM, 4, 1, 3)], ids=["plain", "ngram"])
def test_no_stop_token_before_min_tokens(successor: Path, spec: SpeculativeSettings | None) -> None:
    # With prompt lookup the drafts propose STOP right where the prompt had it, so a verifier that ignored the mask
    # would accept it.
    engine = _engine(successor, spec)
    free = SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(STOP,))
    assert engine.generate([CYCLE * 2], free)[0] == CYCLE[:6]
    held = SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(STOP,), min_tokens=9)
    out = engine.generate([CYCLE * 2], held)[0]
    assert len(out) >= 9 and STOP not in out[:9]
    assert out[:5] == CYCLE[:5]  # the mask changed only what would have stopped it


def test_no_stop_string_before_min_tokens(successor: Path) -> None:
    engine = _engine(successor)
    text = engine.tokenizer.decode(CYCLE[1:3])
    assert text.strip(), "the stop string must be visible text"
    free = engine.generate([CYCLE * 2], SamplingParams(max_tokens=20, temperature=0.0, stop=(text,)))[0]
    assert len(free) <= 3
    held = engine.generate([CYCLE * 2], SamplingParams(max_tokens=20, temperature=0.0, stop=(text,), min_tokens=8))[0]
    assert len(held) >= 8


def test_logit_bias_moves_the_draw_not_the_reported_logprobs(tiny: Path) -> None:
    engine = _engine(tiny)
    prompt = engine.tokenizer.encode("Tell me about rivers.")
    free = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    target = next(t for t in range(100, 2000) if t not in free)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logit_bias=((target, 100.0),), logprobs=0)
    engine.add_request("biased", prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == "biased"]
    assert [t for o in outputs for t in o.new_token_ids] == [target] * 6
    # Raw logits of a random-weight model put ~1/vocab on any one token; the biased distribution would say ~0.
    assert all(lp.logprob < -1.0 for o in outputs for lp in (o.logprobs or []))
    assert sum(len(o.logprobs or []) for o in outputs) == 6


@pytest.mark.parametrize("kwargs, message", [
    ({"min_tokens": 7, "max_tokens": 6}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"logit_bias": ((5, 101.0),)}, "logit_bias"),
])
def test_bad_processing_params_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_logit_bias_outside_the_vocabulary_is_refused(tiny: Path) -> None:
    engine = _engine(tiny)
    with pytest.raises(ValueError, match="logit_bias token ids"):
        engine.add_request("r", [1, 2, 3], SamplingParams(logit_bias=((10**6, 1.0),)))
    assert not engine.has_unfinished_requests()
