"""Prompt-lookup proposer and the --speculative-config parser."""

from __future__ import annotations

import json

import pytest

from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings, parse_speculative_config
from gpu_runtime.speculative.ngram import NgramProposer


def _proposer(k: int = 4, lo: int = 1, hi: int = 3) -> NgramProposer:
    return NgramProposer(SpeculativeSettings(SpecMethod.NGRAM, k, lo, hi))


def test_proposes_what_followed_the_latest_earlier_occurrence_of_the_tail() -> None:
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert _proposer(k=2).propose(context) == [7, 8]  # the latest match wins over the first one


def test_prefers_the_longest_ngram() -> None:
    # The 1-gram "3" last occurred before 4; the 2-gram "2 3" last occurred before 6.
    context = [2, 3, 6, 0, 3, 4, 0, 2, 3]
    assert _proposer(k=1, lo=1, hi=2).propose(context) == [6]
    assert _proposer(k=1, lo=1, hi=1).propose(context) == [4]


def test_no_match_means_no_draft_and_short_matches_are_respected() -> None:
    assert _proposer().propose([1, 2, 3, 4]) == []
    assert _proposer(lo=2).propose([5, 1, 7, 1]) == []  # only a 1-gram matches; min is 2
    assert _proposer(k=5).propose([4, 5, 6, 4]) == [5, 6, 4]  # continuation may run into the tail itself


def test_max_tokens_caps_the_draft() -> None:
    context = [1, 2, 3, 4, 5, 1]
    assert _proposer(k=4).propose(context, max_tokens=2) == [2, 3]
    assert _proposer(k=4).propose(context, max_tokens=0) == []


def test_parses_vllm_spelling_and_the_operators_admin_payload() -> None:
    vllm = parse_speculative_config(
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    )
    assert vllm == SpeculativeSettings(SpecMethod.NGRAM, 5, 2, 4)
    admin = parse_speculative_config(
        {
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 4,
            "draft_model": "/ckpt/draft",
        }
    )
    assert admin == SpeculativeSettings(SpecMethod.DRAFT_MODEL, 3, 1, 4, "/ckpt/draft")
    assert parse_speculative_config(json.loads(admin.to_vllm_json())) == admin
    assert parse_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2}).method is SpecMethod.NGRAM


@pytest.mark.parametrize("off", [None, "", "null", {}])
def test_empty_config_turns_speculation_off(off: object) -> None:
    assert parse_speculative_config(off) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"method":"eagle","num_speculative_tokens":3}', "unsupported speculative method"),
        ('{"method":"ngram","num_speculative_tokens":0}', "num_speculative_tokens"),
        ('{"method":"ngram","prompt_lookup_min":5,"prompt_lookup_max":2}', "prompt_lookup_min"),
        ('{"method":"draft_model"}', 'needs "model"'),
        ('{"method":"ngram","num_tokens":3}', "unknown speculative config keys"),
        ('{"method":"ngram","num_speculative_tokens":"3"}', "must be an integer"),
        ("{method: ngram}", "not valid JSON"),
        ("[1]", "JSON object"),
    ],
)
def test_bad_configs_are_refused_with_a_reason(body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_speculative_config(body)
