"""`--admin-port`: /admin/config answers on its own port only, so a NetworkPolicy can let the operator alone reach
it, while the API, /health and /metrics stay on --port; SIGTERM stops both servers."""

from __future__ import annotations

import signal
from collections.abc import Callable

import httpx
import openai

from tests.harness.ports import free_port
from tests.harness.runtime import ADMIN_TOKEN, RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME

TOKEN_HEADER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_admin_config_is_served_on_the_admin_port_only(start_server: Callable[..., RuntimeServer]) -> None:
    admin_port = free_port()
    server = start_server(f"--admin-port={admin_port}")
    admin = f"http://127.0.0.1:{admin_port}/admin/config"
    assert httpx.get(f"{server.url}/admin/config", headers=TOKEN_HEADER, timeout=10).status_code == 404
    assert httpx.get(admin, headers=TOKEN_HEADER, timeout=10).json()["max_num_seqs"] > 0
    changed = httpx.post(admin, json={"max_num_seqs": 7}, headers=TOKEN_HEADER, timeout=60)
    assert changed.status_code == 200 and changed.json()["max_num_seqs"] == 7
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    answer = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=3)
    assert answer.choices[0].text is not None
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=10).status_code == 404

    process = server._runtime.process
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) is not None  # both servers stop on the main one's signal
    for url in (admin, f"{server.url}/health"):
        try:
            httpx.get(url, timeout=2)
        except httpx.TransportError:
            continue
        raise AssertionError(f"{url} still answers after SIGTERM")
