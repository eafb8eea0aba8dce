"""The quality gate's comparison: agreement up to the first divergence, top-1 and KL only where contexts match."""

from __future__ import annotations

import math

import pytest

from slotune.quality.compare import compare, kl
from slotune.quality.record import ProbeAnswer, QualityRecord, TokenChoice


def choice(token: str, probs: dict[str, float]) -> TokenChoice:
    top = tuple((t, math.log(p)) for t, p in sorted(probs.items(), key=lambda kv: -kv[1]))
    return TokenChoice(token=token, logprob=math.log(probs[token]), top=top)


def answer(*tokens: str, confidence: float = 0.9) -> ProbeAnswer:
    return ProbeAnswer(tokens=tuple(choice(t, {t: confidence, "zz": 1 - confidence - 0.01}) for t in tokens))


def records(*pairs: tuple[ProbeAnswer, ProbeAnswer]) -> tuple[QualityRecord, QualityRecord]:
    return (QualityRecord(max_tokens=8, answers=tuple(p[0] for p in pairs)),
            QualityRecord(max_tokens=8, answers=tuple(p[1] for p in pairs)))


def test_identical_answers_agree_fully_with_zero_kl() -> None:
    same = answer("a", "b", "c")
    measured = compare(*records((same, same), (same, same)))
    assert (measured.token_agreement, measured.top1_agreement, measured.identical) == (1.0, 1.0, 2)
    assert measured.mean_kl == pytest.approx(0.0, abs=1e-12)
    assert measured.positions == 6


def test_agreement_counts_tokens_before_the_first_divergence_over_the_longer_answer() -> None:
    # Diverges at position 2 of 4; the later "d" matches by chance but its context differs: not counted.
    measured = compare(*records((answer("a", "b", "c", "d"), answer("a", "b", "x", "d", "e"))))
    assert measured.token_agreement == pytest.approx(2 / 5)
    assert measured.positions == 3  # the common prefix and the divergent position
    assert measured.top1_agreement == pytest.approx(2 / 3)
    assert measured.identical == 0


def test_an_answer_that_stops_early_is_a_divergence() -> None:
    measured = compare(*records((answer("a", "b"), answer("a", "b", "c", "d"))))
    assert measured.token_agreement == pytest.approx(2 / 4)
    assert measured.identical == 0


def test_kl_is_zero_for_equal_distributions_and_grows_as_they_part() -> None:
    p = choice("a", {"a": 0.6, "b": 0.3, "c": 0.05})
    near = choice("a", {"a": 0.55, "b": 0.33, "c": 0.07})
    far = choice("b", {"b": 0.6, "a": 0.2, "d": 0.1})
    assert kl(p, p) == pytest.approx(0.0, abs=1e-12)
    assert 0 < kl(p, near) < kl(p, far)
    # The exact KL of the coarsened distributions {a, b, c, rest}: the rest bucket carries what the list leaves over.
    expected = sum(x * math.log(x / y) for x, y in ((0.6, 0.55), (0.3, 0.33), (0.05, 0.07), (0.05, 0.05)))
    assert kl(p, near) == pytest.approx(expected, rel=1e-9)


def test_a_token_missing_from_the_candidates_list_gets_at_most_its_smallest_listed_probability() -> None:
    p = choice("a", {"a": 0.5, "b": 0.4})
    q = choice("a", {"a": 0.5, "c": 0.45})  # b unlisted: at most 0.05 (what the list leaves over)
    expected = 0.5 * math.log(0.5 / 0.5) + 0.4 * math.log(0.4 / 0.05) + 0.1 * math.log(0.1 / (1 - 0.5 - 0.05))
    assert kl(p, q) == pytest.approx(expected, rel=1e-9)


def test_records_of_different_lengths_do_not_compare() -> None:
    a = QualityRecord(max_tokens=8, answers=(answer("a"),))
    b = QualityRecord(max_tokens=16, answers=(answer("a"),))
    with pytest.raises(ValueError, match="do not compare"):
        compare(a, b)
