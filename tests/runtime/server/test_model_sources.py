"""`--model` from the command line: a GGUF file serves chat with the template in its metadata, and every bad path
(missing, not a checkpoint, not GGUF, corrupt, unknown package or preset) ends the process with one line on stderr
and a non-zero exit code, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jinja2
import openai
import pytest

from gpu_runtime.tokenizer.tokenizer import Tokenizer
from tests.harness.runtime import RuntimeServer
from tests.runtime.gguf_builder import without_rope_scaling, write_gguf


@pytest.fixture(scope="module")
def nano_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_runtime.checkpoint.builtin import build_checkpoint

    plain = without_rope_scaling(build_checkpoint(tmp_path_factory.mktemp("nano") / "c", preset="nano"),
                                 tmp_path_factory.mktemp("plain") / "c")
    return write_gguf(plain, tmp_path_factory.mktemp("gguf") / "nano.gguf")


def test_gguf_file_serves_chat_with_its_metadata_template(nano_gguf: Path, tmp_path: Path) -> None:
    server = RuntimeServer(nano_gguf, tmp_path, ("--max-num-seqs", "4"), served_model_name="nano")
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]
        result = client.chat.completions.create(model="nano", messages=messages, max_tokens=4, temperature=0)
    finally:
        server.stop()
    tokenizer = Tokenizer(nano_gguf)
    prompt = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(tokenizer.chat_template).render(
        messages=messages, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")  # the file's template, not the fallback
    assert result.usage.prompt_tokens == len(tokenizer.encode(prompt))


def _bad_paths(tmp: Path, nano_gguf: Path) -> dict[str, str]:
    (tmp / "empty").mkdir()
    (tmp / "weightless").mkdir()
    (tmp / "weightless" / "config.json").write_text('{"hidden_size": 8}')
    (tmp / "notes.gguf").write_text("not a model")
    (tmp / "cut.gguf").write_bytes(nano_gguf.read_bytes()[:3000])
    return {"missing": str(tmp / "missing"), "no config.json": str(tmp / "empty"),
            "bad config": str(tmp / "weightless"), "not GGUF": str(tmp / "notes.gguf"),
            "truncated": str(tmp / "cut.gguf"), "no package": "pkg://no_such_package_x/m.gguf",
            "no preset": "builtin://enormous"}


def test_bad_model_paths_fail_with_one_line(nano_gguf: Path, tmp_path: Path) -> None:
    for case, model in _bad_paths(tmp_path, nano_gguf).items():
        done = subprocess.run([sys.executable, "-m", "gpu_runtime", "serve", "--model", model, "--port", "0"],
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0, case
        assert "Traceback" not in done.stderr and len(lines) == 1, (case, done.stderr)
        assert lines[0].startswith("cannot start the engine:"), (case, lines[0])
