"""`spec` of a TunedModel: what to serve, on what hardware, with which engine, to which SLO, and how to tune it.

Every field carries a description (it becomes `kubectl explain` text), bounds and defaults; cross-field rules are
`Rule`s, enforced by pydantic here and by CEL in the generated CRD. `spec.slo` is `slotune.slo.SLOSpec`,
`spec.workload` is `slotune.workload.WorkloadSpec`, and `spec.runtime.config` (the starting knobs) is
`slotune.knobs.RuntimeConfig` without `replicas`, which lives at `spec.replicas`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from slotune.api.quality import QualitySpec
from slotune.api.rules import RULE_ERROR, ApiModel, Rule
from slotune.api.tuning import REPLICAS, Knob, TuningMode, TuningSpec
from slotune.knobs import Engine, KVCacheDtype, RuntimeConfig, SpeculativeMethod
from slotune.slo import SLOSpec
from slotune.workload import WorkloadSpec


class Accelerator(StrEnum):
    NVIDIA_H200 = "nvidia-h200"
    NVIDIA_H100_80GB = "nvidia-h100-80gb"
    NVIDIA_H100_PCIE = "nvidia-h100-pcie"
    NVIDIA_A100_80GB = "nvidia-a100-80gb"
    NVIDIA_A100_40GB = "nvidia-a100-40gb"
    NVIDIA_L4 = "nvidia-l4"
    CPU = "cpu"


class ModelDtype(StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


# The sources the runtimes and the local backend read (gpu_runtime/model_source.py, resources.engine_model):
# hf://org/name (vLLM downloads it), pvc://claim/path (mounted under /models), builtin://preset (a checkpoint the
# runtime builds itself), pkg://package/file (weights inside an installed Python package), file:///abs, /abs and
# ./rel (local mode). A path is segments of safe characters: the source reaches the runtime as one argv element,
# never a shell, but a source with spaces, quotes, `;` or `$(...)` is a mistake or an attack, never a path anyone
# meant; `.` and `..` segments are refused so a pvc:// path stays inside its claim.
_SEGMENT = r"\.?[A-Za-z0-9_+@=-][A-Za-z0-9._+@=-]*"
_PATH = f"(/{_SEGMENT})+"
SOURCE_PATTERN = (
    rf"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*|pvc://[a-z0-9]([a-z0-9.-]*[a-z0-9])?{_PATH}"
    rf"|builtin://[a-z0-9-]+|pkg://[A-Za-z_][A-Za-z0-9_]*{_PATH}|file://{_PATH}|{_PATH}|\.{_PATH})$"
)
_SOURCE_HELP = (
    "one of hf://org/name, pvc://claim/path, builtin://tiny (a checkpoint the runtime builds), pkg://package/file.gguf "
    "(weights shipped in an installed Python package), file:///path, /path (absolute) or ./path; path segments "
    "use only letters, digits and . _ - + @ = (no spaces, quotes, ; or $, no . or .. segments)"
)


class ModelSpec(ApiModel):
    """The model to serve and where its weights come from."""

    name: str = Field(min_length=1, max_length=253, description="Name clients use in the OpenAI API `model` field.")
    source: str = Field(min_length=1, max_length=1024, description=f"Where the weights are: {_SOURCE_HELP}.")
    revision: str | None = Field(default=None, max_length=128, description="Branch, tag or commit (hf:// only).")
    dtype: ModelDtype = Field(default=ModelDtype.AUTO, description="Weight dtype; auto takes the checkpoint's.")
    max_model_len: int | None = Field(
        default=None, ge=16, le=1048576, description="Longest prompt + output in tokens; absent: the checkpoint's."
    )
    draft_model: str | None = Field(
        default=None, min_length=1, max_length=1024,
        description=f"Smaller model of the same tokenizer for draft_model speculation: {_SOURCE_HELP}.",
    )


    # A rule rather than a schema pattern, so both enforcers say what a source looks like instead of a regex.
    RULES = (
        # The name is a label value in every PromQL query and a field in every request: no control characters.
        Rule("!self.name.matches('[[:cntrl:]]')", "name must not contain control characters (newline, tab, ...)",
             ".name", lambda m: not any(ord(c) < 32 or ord(c) == 127 for c in m.name)),
        Rule(f"self.source.matches(r'{SOURCE_PATTERN}')", f"source must be {_SOURCE_HELP}", ".source",
             lambda m: re.fullmatch(SOURCE_PATTERN, m.source) is not None),
        Rule(f"!has(self.draftModel) || self.draftModel.matches(r'{SOURCE_PATTERN}')",
             f"draftModel must be {_SOURCE_HELP}", ".draftModel",
             lambda m: m.draft_model is None or re.fullmatch(SOURCE_PATTERN, m.draft_model) is not None),
    )


class Toleration(ApiModel):
    """A Kubernetes toleration for the runtime pods (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=316, description="Taint key to tolerate; absent: all keys.")
    operator: str = Field(default="Equal", pattern=r"^(Equal|Exists)$", description="Equal or Exists.")
    value: str | None = Field(default=None, max_length=63, description="Taint value matched by Equal.")
    effect: str | None = Field(
        default=None, pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$", description="Taint effect; absent: all."
    )
    toleration_seconds: int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class HardwareSpec(ApiModel):
    """The accelerator each runtime replica gets; the performance model reads its bandwidth, FLOPs and memory."""

    accelerator: Accelerator = Field(description="Accelerator model of one replica; cpu for local and test runs.")
    count: int = Field(
        default=1, ge=0, le=64, description="Accelerators per replica (tensor parallel size); 0 only with cpu."
    )
    node_selector: dict[str, str] = Field(
        default={}, description="Node labels the runtime pods must match (Kubernetes only)."
    )
    tolerations: list[Toleration] = Field(
        default=[], max_length=32, description="Taints the runtime pods tolerate (Kubernetes only)."
    )

    RULES = (
        Rule("self.accelerator == 'cpu' || self.count >= 1", "count must be at least 1 for a GPU accelerator",
             ".count", lambda h: h.accelerator is Accelerator.CPU or h.count >= 1, ("self.count",)),
    )


# A Kubernetes quantity (apimachinery's resource.Quantity grammar) that is not negative: 4, 500m, 64Gi, 1e3. Checked at
# apply time, so `cpu: lots` is refused naming spec.runtime.resources.limits.cpu and its value, not later by the
# Deployment's conversion (an HTTP 500 naming neither).
QUANTITY_PATTERN = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
                    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def _quantity(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, int) and value < 0) or (
            isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value) is None):
        raise PydanticCustomError("quantity", "'{value}' is not a Kubernetes quantity of at least 0 (e.g. 4, 500m, "
                                  "64Gi)", {"value": value})
    return value


Quantity = Annotated[int | str, BeforeValidator(_quantity), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": QUANTITY_PATTERN}]})]


class Resources(ApiModel):
    """Compute resources of one runtime container (core/v1 ResourceRequirements); GPUs come from hardware."""

    requests: dict[str, Quantity] = Field(
        default={}, description="Minimum resources, e.g. cpu: 4 (Kubernetes quantities: 4, 500m, 64Gi).")
    limits: dict[str, Quantity] = Field(
        default={}, description="Maximum resources, e.g. memory: 64Gi (Kubernetes quantities: 4, 500m, 64Gi).")


class RuntimeSpec(ApiModel):
    """The serving engine, its container, and the knobs it starts with."""

    engine: Engine = Field(default=Engine.BUILTIN, description="builtin (slotune's gpu_runtime) or vllm.")
    image: str | None = Field(
        default=None, max_length=512,
        description="Container image; absent: the engine's. Only repositories the cluster's runtime policy allows "
        "(chart value runtimePolicy.allowedImages).",
    )
    resources: Resources | None = Field(default=None, description="CPU and memory of each runtime container.")
    extra_args: list[str] = Field(
        default=[], max_length=64,
        description="Extra engine flags, appended after the operator's. Flags the operator sets (--port, --host, "
        "--admin-token-file, --model, the tuned knobs, ...) are refused, and --trust-remote-code unless the cluster's "
        "runtime policy allows it (chart values runtimePolicy).",
    )
    config: RuntimeConfig = Field(
        default=RuntimeConfig(), json_schema_extra={"x-slotune-omit": ["replicas"]},
        description="Knobs the runtime starts with, before any tuning; replicas are set by spec.replicas.",
    )

    @field_validator("config", mode="after")
    @classmethod
    def _no_replicas(cls, config: RuntimeConfig) -> RuntimeConfig:
        if "replicas" in config.model_fields_set:
            raise PydanticCustomError(
                RULE_ERROR, "set the initial replica count in spec.replicas, not here", {"field_path": ".replicas"}
            )
        return config


def _bounds_hold(spec: Any, knob: str) -> bool:
    bounds = getattr(spec.tuning.bounds, knob)
    return bounds.min <= getattr(spec.runtime.config, knob) <= bounds.max


def _range_values(knob: str) -> tuple[str, ...]:
    return f"self.runtime.config.{knob}", f"self.tuning.bounds.{knob}.min", f"self.tuning.bounds.{knob}.max"


def _in_range(knob: str) -> str:
    value, bounds = f"self.runtime.config.{knob}", f"self.tuning.bounds.{knob}"
    return f"{value} >= {bounds}.min && {value} <= {bounds}.max"


# The rules on the starting knobs, apart from the rest: the tuner checks every config it proposes against them
# (`config_refusals`), so it never proposes one `kubectl apply` or `slotune validate` would refuse. The engine's
# kvCacheDtype rule stays with the spec: the tuner does not know the engine, and never moves that knob on builtin
# (the knob is refused in tuning.knobs there).
CONFIG_RULES = (
    Rule(_in_range("maxNumSeqs"), "runtime.config.maxNumSeqs must lie within tuning.bounds.maxNumSeqs",
         ".runtime.config.maxNumSeqs", lambda s: _bounds_hold(s, "max_num_seqs"), _range_values("maxNumSeqs")),
    Rule(_in_range("maxNumBatchedTokens"),
         "runtime.config.maxNumBatchedTokens must lie within tuning.bounds.maxNumBatchedTokens",
         ".runtime.config.maxNumBatchedTokens", lambda s: _bounds_hold(s, "max_num_batched_tokens"),
         _range_values("maxNumBatchedTokens")),
    Rule("!has(self.model.maxModelLen) || self.runtime.config.enableChunkedPrefill"
         " || self.runtime.config.maxNumBatchedTokens >= self.model.maxModelLen",
         "without chunked prefill maxNumBatchedTokens must be at least model.maxModelLen (a whole prompt per "
         "step): raise it or enable chunked prefill", ".runtime.config.maxNumBatchedTokens",
         lambda s: s.model.max_model_len is None or s.runtime.config.enable_chunked_prefill
         or s.runtime.config.max_num_batched_tokens >= s.model.max_model_len,
         ("self.runtime.config.maxNumBatchedTokens", "self.model.maxModelLen")),
)


class TunedModelSpec(ApiModel):
    """A model to serve, the latency SLO it must meet, and how slotune may tune it to get there."""

    model: ModelSpec = Field(description="The model to serve and where its weights come from.")
    hardware: HardwareSpec = Field(description="The accelerator each replica runs on.")
    runtime: RuntimeSpec = Field(default=RuntimeSpec(), description="The serving engine and its starting knobs.")
    slo: SLOSpec = Field(description="Latency targets (milliseconds) every window must meet, and a throughput floor.")
    workload: WorkloadSpec | None = Field(
        default=None, description="Expected traffic: replayed in benchmark mode, the simulator's prior otherwise.",
    )
    tuning: TuningSpec = Field(default=TuningSpec(), description="Which knobs slotune may change, within what bounds.")
    quality: QualitySpec = Field(
        default=QualitySpec(), description="How far a change that can alter outputs (quantization, fp8 KV cache, "
        "speculation) may move them, measured on a fixed probe set before it is kept.",
    )
    replicas: int = Field(default=1, ge=1, le=REPLICAS.maximum, description="Runtime replicas to start with.")

    RULES = (
        Rule("!has(self.tuning.bounds.maxReplicas) || self.tuning.bounds.maxReplicas >= self.replicas",
             "maxReplicas must be at least spec.replicas", ".tuning.bounds.maxReplicas",
             lambda s: s.tuning.bounds.max_replicas is None or s.tuning.bounds.max_replicas >= s.replicas,
             ("self.tuning.bounds.maxReplicas", "self.replicas")),
        Rule("self.replicas >= self.tuning.bounds.minReplicas", "replicas must be at least tuning.bounds.minReplicas",
             ".replicas", lambda s: s.replicas >= s.tuning.bounds.min_replicas,
             ("self.replicas", "self.tuning.bounds.minReplicas")),
        Rule("!('draft_model' in self.tuning.bounds.speculativeMethods) || has(self.model.draftModel)",
             "speculative method draft_model needs spec.model.draftModel: set it or allow only ngram",
             ".tuning.bounds.speculativeMethods",
             lambda s: SpeculativeMethod.DRAFT_MODEL not in s.tuning.bounds.speculative_methods
             or s.model.draft_model is not None),
        *CONFIG_RULES,
        Rule("!(self.model.source.startsWith('builtin://') || self.model.source.startsWith('pkg://'))"
             " || self.runtime.engine == 'builtin'",
             "builtin:// and pkg:// models are read by the builtin engine only: set runtime.engine builtin",
             ".runtime.engine",
             lambda s: not s.model.source.startswith(("builtin://", "pkg://")) or s.runtime.engine is Engine.BUILTIN),
        # The builtin runtime keeps its KV cache in the model's dtype and refuses --kv-cache-dtype fp8 at start:
        # refused here, a manifest fails at apply time instead of as a crash-looping pod.
        Rule("self.runtime.engine != 'builtin' || self.runtime.config.kvCacheDtype == 'auto'",
             "kvCacheDtype fp8 needs runtime.engine vllm (the builtin runtime has no fp8 KV cache): set it to auto "
             "or use vllm", ".runtime.config.kvCacheDtype",
             lambda s: s.runtime.engine is not Engine.BUILTIN or s.runtime.config.kv_cache_dtype is KVCacheDtype.AUTO),
        Rule("self.runtime.engine != 'builtin' || !self.tuning.knobs.exists(k, k == 'kv_cache_dtype')",
             "knob kv_cache_dtype needs runtime.engine vllm (the builtin runtime has no fp8 KV cache): remove it "
             "from tuning.knobs or use vllm", ".tuning.knobs",
             lambda s: s.runtime.engine is not Engine.BUILTIN or Knob.KV_CACHE_DTYPE not in s.tuning.knobs),
        Rule("self.tuning.mode != 'benchmark' || has(self.workload)",
             "tuning.mode benchmark replays spec.workload: set it", ".tuning.mode",
             lambda s: s.tuning.mode is not TuningMode.BENCHMARK or s.workload is not None),
    )

    def initial_config(self) -> RuntimeConfig:
        """The config the first deployment runs: the starting knobs at the starting replica count."""
        return self.runtime.config.with_changes(replicas=self.replicas)

    def replica_range(self) -> tuple[int, int]:
        """(fewest, most) replicas the tuner may use; without maxReplicas the count stays at spec.replicas."""
        bounds = self.tuning.bounds
        if Knob.REPLICAS not in self.tuning.knobs:
            return self.replicas, self.replicas
        return bounds.min_replicas, bounds.max_replicas or self.replicas


def config_refusals(config: RuntimeConfig, tuning: TuningSpec, max_model_len: int | None) -> tuple[str, ...]:
    """What the API would refuse `config` for as the starting knobs under `tuning` (`CONFIG_RULES`, each message with
    the values it read): how the tuner checks the configs it proposes against the same rules as the API."""
    # Unvalidated on purpose: only the fields the rules read are set, and the rules are what is evaluated.
    spec = TunedModelSpec.model_construct(model=ModelSpec.model_construct(max_model_len=max_model_len),
                                          runtime=RuntimeSpec.model_construct(config=config), tuning=tuning)
    return tuple(rule.explain(spec) for rule in CONFIG_RULES if rule.holds is not None and not rule.holds(spec))
