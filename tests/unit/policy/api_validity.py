"""A proposed config checked the way `slotune validate` checks a manifest: written as a TunedModel's starting
config (spec.runtime.config, spec.replicas) next to the tuning it was proposed under, and parsed by the loader."""

from __future__ import annotations

from pathlib import Path

import yaml

from slotune.api import InvalidTunedModel, TuningSpec, parse_tunedmodel
from slotune.knobs import RuntimeConfig

BASE = Path(__file__).resolve().parents[3] / "examples" / "chat-h100.yaml"


def api_refusal(config: RuntimeConfig, tuning: TuningSpec, max_model_len: int) -> str | None:
    """Why the API would refuse `config` as a starting config under `tuning`, or None."""
    manifest = yaml.safe_load(BASE.read_text())
    spec = manifest["spec"]
    spec["model"]["maxModelLen"] = max_model_len
    spec["runtime"]["config"] = config.model_dump(mode="json", by_alias=True, exclude={"replicas"})
    spec["replicas"] = config.replicas
    spec["tuning"] = tuning.model_dump(mode="json", by_alias=True, exclude_none=True)
    try:
        parse_tunedmodel(manifest)
    except InvalidTunedModel as error:
        return str(error)
    return None
