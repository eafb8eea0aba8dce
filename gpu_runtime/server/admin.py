"""`GET/POST /admin/config`: read and change the runtime's knobs live, guarded by a bearer token.

The body is the operator's `RuntimeConfig.admin_payload()` (operator/slotune/knobs/config.py): any subset of the hot
knobs (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, enable_prefix_caching, speculative,
quantization). Every change runs on the engine worker between two steps (`LLMEngine.reconfigure`, `set_speculative`,
`set_quantization`), so requests in flight continue under the new settings; a value the engine refuses leaves the old
one in place and answers 400.

Bounds and choices are not written here: they come from the generated knob schema (`gpu_runtime.config.KNOBS`,
from operator/slotune/knobs/schema.py), so this endpoint accepts exactly what the operator's API and the flags do.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from gpu_runtime.config import KNOBS, PROMPT_LOOKUP, SPECULATIVE_TOKENS, KnobLimits, SchedulerKnobs
from gpu_runtime.server.async_engine import AsyncEngine
from gpu_runtime.server.protocol import APIError
from gpu_runtime.speculative.config import SpeculativeSettings, parse_speculative_config


def _int_in(bounds: tuple[int | None, int | None]) -> Any:
    return Annotated[StrictInt, Field(ge=bounds[0], le=bounds[1])]


def _choice_of(limits: KnobLimits) -> Any:
    def check(value: str) -> str:
        limits.check(value)
        return value

    return Annotated[str, AfterValidator(check)]


SpeculativeTokens = _int_in(SPECULATIVE_TOKENS)
PromptLookup = _int_in(PROMPT_LOOKUP)
MaxNumSeqs = _int_in((KNOBS["max_num_seqs"].minimum, KNOBS["max_num_seqs"].maximum))
MaxNumBatchedTokens = _int_in((KNOBS["max_num_batched_tokens"].minimum, KNOBS["max_num_batched_tokens"].maximum))
QuantizationName = _choice_of(KNOBS["quantization"])


class SpeculativeBody(BaseModel):
    """Speculative decoding as knobs.py's SpeculativeConfig dumps it (snake_case)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: Literal["ngram", "draft_model"]
    num_speculative_tokens: SpeculativeTokens = 4
    prompt_lookup_min: PromptLookup = 1
    prompt_lookup_max: PromptLookup = 4
    draft_model: str | None = None

    @classmethod
    def of(cls, settings: SpeculativeSettings | None) -> SpeculativeBody | None:
        if settings is None:
            return None
        return cls(method=settings.method.value, num_speculative_tokens=settings.num_speculative_tokens,
                   prompt_lookup_min=settings.prompt_lookup_min, prompt_lookup_max=settings.prompt_lookup_max,
                   draft_model=settings.draft_model)

    def settings(self) -> SpeculativeSettings | None:
        return parse_speculative_config(self.model_dump())


class AdminConfig(BaseModel):
    """The live knobs: what GET returns and what POST sets (any subset)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_num_seqs: MaxNumSeqs
    max_num_batched_tokens: MaxNumBatchedTokens
    enable_chunked_prefill: StrictBool
    enable_prefix_caching: StrictBool
    speculative: SpeculativeBody | None = None
    quantization: QuantizationName = "none"

    def knobs(self) -> SchedulerKnobs:
        return SchedulerKnobs(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                              enable_chunked_prefill=self.enable_chunked_prefill,
                              enable_prefix_caching=self.enable_prefix_caching)


class AdminState:
    """The admin token (None: admin disabled) and how to read the live configuration off the engine."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    @staticmethod
    def current(engine: AsyncEngine) -> AdminConfig:
        llm = engine.engine
        return AdminConfig(**dataclasses.asdict(llm.knobs), speculative=SpeculativeBody.of(llm.speculative),
                           quantization=llm.quantization)


def _check_token(state: AdminState, authorization: str | None, admin_token: str | None = None) -> None:
    """The token comes as `Authorization: Bearer T` or, through the Kubernetes API server's pod proxy (which
    consumes the Authorization header to authenticate the caller and drops it), as `X-Slotune-Admin-Token: T`."""
    if state.token is None:
        raise APIError(401, "admin API disabled: start the server with --admin-token-file or SLOTUNE_ADMIN_TOKEN",
                       type_="authentication_error", code="admin_disabled")
    scheme, _, presented = (authorization or "").partition(" ")
    bearer = presented.strip() if scheme.lower() == "bearer" else None
    offered = [t for t in (bearer, admin_token) if t]
    if not any(hmac.compare_digest(t.encode(), state.token.encode()) for t in offered):
        raise APIError(401, "missing or invalid bearer token", type_="authentication_error", code="invalid_token")


async def _parse_update(request: Request, current: AdminConfig) -> AdminConfig:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"body is not valid JSON: {error}") from error
    if not isinstance(body, dict):
        raise APIError(400, "body must be a JSON object of knobs")
    try:
        return AdminConfig.model_validate(current.model_dump() | body)
    except ValidationError as error:
        raise APIError(400, f"invalid knob values: {_first_errors(error)}", code="invalid_config") from error


def _first_errors(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])


async def _apply(engine: AsyncEngine, current: AdminConfig, wanted: AdminConfig) -> None:
    try:
        knobs = wanted.knobs()
        if knobs != engine.engine.knobs:
            await engine.call(lambda e: e.reconfigure(knobs))
        if wanted.speculative != current.speculative:
            spec = None if wanted.speculative is None else wanted.speculative.settings()
            await engine.call(lambda e: e.set_speculative(spec))
        if wanted.quantization != current.quantization:
            await engine.call(lambda e: e.set_quantization(wanted.quantization))
    except ValueError as error:
        raise APIError(400, f"invalid configuration: {error}", code="invalid_config") from error


def build_admin_router(engine: AsyncEngine, state: AdminState) -> APIRouter:
    router = APIRouter()

    @router.get("/admin/config")
    async def get_config(authorization: Annotated[str | None, Header()] = None,
                         x_slotune_admin_token: Annotated[str | None, Header()] = None) -> AdminConfig:
        _check_token(state, authorization, x_slotune_admin_token)
        return state.current(engine)

    @router.post("/admin/config")
    async def post_config(request: Request, authorization: Annotated[str | None, Header()] = None,
                          x_slotune_admin_token: Annotated[str | None, Header()] = None) -> AdminConfig:
        _check_token(state, authorization, x_slotune_admin_token)
        current = state.current(engine)
        wanted = await _parse_update(request, current)
        await _apply(engine, current, wanted)
        return state.current(engine)

    return router
