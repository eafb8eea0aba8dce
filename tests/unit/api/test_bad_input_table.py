"""docs/bad-input.md is what tests/bad_input_table.py makes of the case files, and the suite is big enough."""

from __future__ import annotations

from slotune.api import InvalidTunedModel, parse_tunedmodel
from tests.bad_input_table import DOC, render
from tests.unit.api_cases import degraded_cases, invalid_cases


def test_the_committed_table_is_current() -> None:
    assert DOC.read_text() == render(), "run: .venv/bin/python -m tests.bad_input_table --write"


def test_the_suite_holds_at_least_40_cases() -> None:
    names = [c.name for c in invalid_cases()] + [c.name for c in degraded_cases()]
    assert len(names) == len(set(names)) >= 40


def test_the_loader_accepts_every_degraded_case() -> None:
    # Their fault is past the schema: the operator, not the loader, is what must catch them.
    for case in degraded_cases():
        try:
            parse_tunedmodel(case.manifest)
        except InvalidTunedModel as error:
            raise AssertionError(f"{case.name}: {error}") from error
