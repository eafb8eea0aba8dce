"""Which TunedModel field produced the child field the API server refused: its answer names the Deployment's path
(`spec.template.spec.containers[0].resources.requests[gpus]`), which a TunedModel's author never wrote. The refusal
is reported with the TunedModel's own field (`spec.runtime.resources.requests.gpus`) beside the server's words.
"""

from __future__ import annotations

import re

_CONTAINER = r"spec\.template\.spec\.containers\[0\]\."
# (the Deployment path, as the API server writes it; the TunedModel field it comes from, \N for its groups)
_SOURCES = (
    (_CONTAINER + r"resources\.(requests|limits)\[([^\]]+)\]", r"spec.runtime.resources.\1.\2"),
    (_CONTAINER + r"resources\.(requests|limits)", r"spec.runtime.resources.\1"),
    (_CONTAINER + r"image", "spec.runtime.image"),
    (_CONTAINER + r"args", "spec.runtime.extraArgs"),
    (r"spec\.template\.spec\.nodeSelector", "spec.hardware.nodeSelector"),
    (r"spec\.template\.spec\.tolerations((\[\d+\])(\.\w+)?)?", r"spec.hardware.tolerations\1"),
)


def tunedmodel_fields(message: str) -> list[str]:
    """The TunedModel fields behind the Deployment paths `message` names, in order, each once."""
    found: list[str] = []
    for match in re.finditer(r"spec\.template\.spec\.[\w.\[\]/-]+", message):
        for pattern, source in _SOURCES:
            hit = re.match(pattern, match.group(0))
            if hit is not None:
                field = hit.expand(source)
                if field not in found:
                    found.append(field)
                break
    return found
