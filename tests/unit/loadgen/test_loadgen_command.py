"""`slotune bench` flags -> the workload: length flags apply before validation, and a custom profile needs them."""

from __future__ import annotations

import argparse

import pytest

from slotune.loadgen.command import add_arguments, workload_from_args
from slotune.workload import Profile, WorkloadSpec


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--url", "http://127.0.0.1:1", "--num-requests", "1", *flags])


def test_custom_profile_takes_its_lengths_from_the_flags() -> None:
    spec = workload_from_args(parse("--profile", "custom", "--rate", "2", "--prompt-tokens", "271", "271",
                                    "--output-tokens", "16", "64"))
    assert spec.profile is Profile.CUSTOM
    assert (spec.prompt.p50, spec.prompt.p99, spec.output.p50, spec.output.p99) == (271, 271, 16, 64)


@pytest.mark.parametrize("flags", [(), ("--prompt-tokens", "10", "20"), ("--output-tokens", "10", "20")])
def test_custom_profile_without_both_lengths_says_which_flags(flags: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit, match="--prompt-tokens P50 P99 and --output-tokens P50 P99"):
        workload_from_args(parse("--profile", "custom", "--rate", "2", *flags))


def test_a_named_profile_keeps_what_the_flags_leave_alone() -> None:
    chat = WorkloadSpec.model_validate({"profile": "chat"})
    spec = workload_from_args(parse("--profile", "chat", "--rate", "2", "--prompt-tokens", "20", "60",
                                    "--max-prompt-tokens", "100"))
    assert (spec.prompt.p50, spec.prompt.p99, spec.prompt.max) == (20, 60, 100)
    assert spec.output == chat.output and spec.arrival == chat.arrival


def test_a_cut_below_the_profile_minimum_lowers_the_minimum() -> None:
    spec = workload_from_args(parse("--profile", "prefix-heavy", "--rate", "2", "--max-prompt-tokens", "1050",
                                    "--prompt-tokens", "1060", "1070"))
    # prefix-heavy draws at least 1100 tokens; a 1050 cut lowers that, still above its 1024-token shared prefix.
    assert spec.prompt.min == spec.prompt.max == 1050


def test_invalid_lengths_are_refused_with_the_reason() -> None:
    with pytest.raises(SystemExit, match="p99"):
        workload_from_args(parse("--profile", "custom", "--rate", "2", "--prompt-tokens", "50", "10",
                                 "--output-tokens", "4", "4"))
