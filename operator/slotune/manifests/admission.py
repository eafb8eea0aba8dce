"""The cluster admin's runtime policy: which images and engine flags a TunedModel author may ask for.

A TunedModel's pods run with what its author wrote (image, extraArgs), created by the operator's service account, so
without a bound a namespace user gets any pod they like. The bound is the admin's, set in the chart values
(`runtimePolicy`): allowed image repositories per engine, whether extraArgs are allowed at all, whether remote code
may be trusted. The flags the operator itself sets (`OPERATOR_FLAGS`) are never overridable.

Two enforcers, one rule set: the chart renders these rules as a ValidatingAdmissionPolicy (CEL,
charts/slotune/templates/admission-policy.yaml), so the API server refuses a breaking TunedModel at apply time;
`violations` here is the Python twin the operator runs before creating any child, for clusters where the policy is
not installed (or was created before the policy). tests/unit/test_admission.py and
tests/integration/test_admission_policy.py hold both to the same cases and the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slotune.api import TunedModelSpec
from slotune.knobs import Engine
from slotune.knobs.schema import KNOBS, KnobKind
from slotune.settings import OperatorSettings


def _knob_flags() -> tuple[str, ...]:
    flags = []
    for knob in KNOBS:
        if knob.flag is None:
            continue
        flags.append(knob.flag)
        if knob.kind is KnobKind.BOOL:
            flags.append("--no-" + knob.flag.removeprefix("--"))
    return tuple(flags)


# Flags the operator sets or that would replace what it sets: where the runtime listens, which model it serves, its
# admin token, its parallelism, a config file of flags (vLLM's --config), and every tuned knob (the status promises
# that pods run the config it shows). The chart's policy renders the same list (a unit test compares them).
OPERATOR_FLAGS: tuple[str, ...] = (
    "--model", "--served-model-name", "--host", "--port", "--admin-port", "--uds", "--admin-token-file", "--device",
    "--dtype", "--max-model-len", "--revision", "--tensor-parallel-size", "-tp", "--config", "-q",
    "--slo-bucket-edges", *_knob_flags(),
)
REMOTE_CODE_FLAGS: tuple[str, ...] = ("--trust-remote-code",)
MIN_ABBREVIATION = 3  # argparse accepts any unambiguous prefix of a long flag ("--po" for "--port")
REFUSED = "refused by the runtime policy"  # how every refusal the operator reports begins (status reads it back)


@dataclass(frozen=True)
class RuntimePolicy:
    builtin_images: tuple[str, ...] = ("ghcr.io/slotune/runtime",)
    """Image repositories the builtin engine may run (a repository, or a registry path above several)."""
    vllm_images: tuple[str, ...] = ("vllm/vllm-openai",)
    """Image repositories the vllm engine may run."""
    allow_extra_args: bool = True
    """Whether spec.runtime.extraArgs may be set at all (operator-owned flags are refused either way)."""
    allow_remote_code: bool = False
    """Whether --trust-remote-code may be passed (it runs Python shipped with the model)."""

    @classmethod
    def of(cls, settings: OperatorSettings) -> RuntimePolicy:
        return cls(builtin_images=settings.allowed_builtin_images, vllm_images=settings.allowed_vllm_images,
                   allow_extra_args=settings.allow_extra_args, allow_remote_code=settings.allow_remote_code)

    def images(self, engine: Engine) -> tuple[str, ...]:
        return self.vllm_images if engine is Engine.VLLM else self.builtin_images

    def denied_flags(self) -> tuple[str, ...]:
        return OPERATOR_FLAGS if self.allow_remote_code else (*OPERATOR_FLAGS, *REMOTE_CODE_FLAGS)


@dataclass(frozen=True)
class Violation:
    rule: str  # image | extraArgs | operatorFlag | remoteCode
    message: str

    def __str__(self) -> str:
        return f"{self.message} (runtime policy rule {self.rule})"


def image_allowed(image: str, repositories: Sequence[str]) -> bool:
    """`image` is one of `repositories`, or a tag, digest or sub-path of one (never a mere string prefix:
    ghcr.io/slotune/runtime does not allow ghcr.io/slotune/runtime-evil)."""
    return any(image == r or image.startswith((r + ":", r + "@", r + "/")) for r in repositories)


def flag_name(arg: str) -> str | None:
    """The flag an argument names, spelled as argparse and vLLM read it (`--admin_token_file=x` -> --admin-token-file);
    None for a value."""
    if not arg.startswith("-"):
        return None
    return arg.split("=", 1)[0].replace("_", "-")


def overrides(name: str, flag: str) -> bool:
    """Whether `name` would set `flag`: the flag itself or an abbreviation argparse would expand to it."""
    return name == flag or (name.startswith("--") and len(name) >= MIN_ABBREVIATION and flag.startswith(name))


def violations(spec: TunedModelSpec, policy: RuntimePolicy) -> list[Violation]:
    """Every way `spec` breaks `policy`, in the order the admission policy checks them."""
    found = []
    engine, image = spec.runtime.engine, spec.runtime.image
    if image and not image_allowed(image, policy.images(engine)):
        allowed = ", ".join(policy.images(engine)) or "none"
        found.append(Violation("image", f"spec.runtime.image: {image} is not an allowed {engine.value} image "
                                        f"(allowed repositories: {allowed})"))
    if spec.runtime.extra_args and not policy.allow_extra_args:
        found.append(Violation("extraArgs", "spec.runtime.extraArgs: the cluster policy allows no extraArgs"))
    names = [n for n in map(flag_name, spec.runtime.extra_args) if n is not None]
    if owned := [n for n in names if any(overrides(n, f) for f in OPERATOR_FLAGS)]:
        found.append(Violation("operatorFlag", f"spec.runtime.extraArgs: {owned[0]} is set by the operator "
                                               "and cannot be overridden"))
    if not policy.allow_remote_code and (remote := [n for n in names if any(overrides(n, f) for f in
                                                                            REMOTE_CODE_FLAGS)]):
        found.append(Violation("remoteCode", f"spec.runtime.extraArgs: {remote[0]} is not allowed: the cluster "
                                             "policy does not trust remote code"))
    return found


def refusal(spec: TunedModelSpec, policy: RuntimePolicy) -> str | None:
    """One line naming every broken rule, or None when `spec` is allowed."""
    found = violations(spec, policy)
    return "; ".join(map(str, found)) if found else None
