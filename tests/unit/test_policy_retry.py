"""A change lost in noise at one config is tried again once the config that hid it changed (issue 17's SmolLM2 run:
prefix caching, rolled back at max_num_seqs 1 where requests queue behind one sequence, never came back). The
policy's hysteresis allows it: configs are excluded by their full key (prefix caching at 16 sequences is a config
never tried), and a knob setting is refused only after MAX_MOVE_ATTEMPTS rollbacks. In that run it never came back
because max_num_seqs 8 and 16 were rolled back for breaking TPOT while the worst miss shrank, so the config that hid
it never changed (slotune.policy.worst_miss keeps such a change now: tests/unit/test_loop_worst_miss.py)."""

from __future__ import annotations

from slotune.api.tuning import Knob, KnobBounds, TuningSpec
from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.policy import MAX_MOVE_ATTEMPTS, PolicyInput
from slotune.policy.sizing import admissible, move_key
from slotune.slo import SLOSpec
from slotune.snapshot import MetricsSnapshot, Source

ONE = RuntimeConfig(max_num_seqs=1, enable_prefix_caching=False, replicas=1)
SIXTEEN = ONE.with_changes(max_num_seqs=16)
SLO = SLOSpec.model_validate({"ttft": {"p99": 10_000}, "tpot": {"p99": 600}})


def _given(config: RuntimeConfig, rolled_back: tuple[str, ...]) -> PolicyInput:
    tried = frozenset({ONE.key(), ONE.with_changes(enable_prefix_caching=True).key(), SIXTEEN.key()})
    return PolicyInput(config, MetricsSnapshot(Source.SIMULATOR, 60.0, 100), SLO,
                       TuningSpec(bounds=KnobBounds(max_replicas=1)), Deployment.from_names("llama-3.1-8b", "l4"),
                       tried, rolled_back)


def test_prefix_caching_rolled_back_at_one_sequence_is_admissible_again_at_sixteen():
    prefix_at_one = move_key(ONE, ONE.with_changes(enable_prefix_caching=True))
    on = SIXTEEN.with_changes(enable_prefix_caching=True)
    assert admissible(on, Knob.ENABLE_PREFIX_CACHING, _given(SIXTEEN, (prefix_at_one,)))
    # at the config that hid it, never again; after MAX_MOVE_ATTEMPTS rollbacks, nowhere
    assert not admissible(ONE.with_changes(enable_prefix_caching=True), Knob.ENABLE_PREFIX_CACHING,
                          _given(ONE, (prefix_at_one,)))
    assert not admissible(on, Knob.ENABLE_PREFIX_CACHING, _given(SIXTEEN, (prefix_at_one,) * MAX_MOVE_ATTEMPTS))
