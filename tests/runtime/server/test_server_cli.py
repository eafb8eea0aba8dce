"""The serve command line accepts every flag the operator renders (vLLM spelling) and the runtime's own."""

from __future__ import annotations

import pytest

from gpu_runtime.cli import admin_token, build_parser
from gpu_runtime.server.admin import SpeculativeBody
from slotune.knobs import Quantization, RuntimeConfig, SpeculativeConfig, SpeculativeMethod


def _parse(*flags: str):
    return build_parser().parse_args(["serve", "--model", "/m", *flags])


@pytest.mark.parametrize("config", [
    RuntimeConfig(),
    RuntimeConfig(max_num_seqs=3, max_num_batched_tokens=64, enable_chunked_prefill=False,
                  enable_prefix_caching=False),
    RuntimeConfig(speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=5,
                                                prompt_lookup_min=2, prompt_lookup_max=3),
                  quantization=Quantization.INT8),
    RuntimeConfig(speculative=SpeculativeConfig(method=SpeculativeMethod.DRAFT_MODEL, draft_model="/draft")),
])
def test_operator_rendered_flags_parse_to_the_same_knobs(config: RuntimeConfig) -> None:
    args = _parse(*config.engine_args())
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (config.max_num_seqs, config.max_num_batched_tokens)
    assert args.enable_chunked_prefill is config.enable_chunked_prefill
    assert args.enable_prefix_caching is config.enable_prefix_caching
    assert args.quantization == config.quantization.value
    if config.speculative is None:
        assert args.speculative_config is None
    else:  # the same knobs the admin payload carries
        assert SpeculativeBody.of(args.speculative_config).model_dump() == config.admin_payload()["speculative"]


def test_runtime_flags_and_defaults() -> None:
    args = _parse("--host", "0.0.0.0", "--port", "9", "--served-model-name", "x", "--max-model-len", "128",
                  "--dtype", "float32", "--device", "cpu", "--kv-cache-memory-bytes", "1000", "--block-size", "8",
                  "--gpu-memory-utilization", "0.5", "--max-waiting-requests", "3", "--num-threads", "1",
                  "--seed", "7", "--kv-cache-dtype", "auto")
    assert (args.port, args.max_model_len, args.kv_cache_memory_bytes, args.block_size) == (9, 128, 1000, 8)
    assert (args.max_waiting_requests, args.num_threads, args.seed, args.served_model_name) == (3, 1, 7, "x")
    defaults = _parse()
    assert defaults.enable_chunked_prefill and defaults.enable_prefix_caching and defaults.max_num_seqs == 256


@pytest.mark.parametrize("bad", [["--speculative-config", "{not json"], ["--speculative-config", '{"method":"x"}'],
                                 ["--quantization", "awq4"], ["--max-num-seqs", "many"]])
def test_bad_flags_exit_with_usage_error(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse(*bad)
    assert exited.value.code == 2


def test_admin_token_from_file_then_env(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLOTUNE_ADMIN_TOKEN", raising=False)
    assert admin_token(_parse()) is None
    monkeypatch.setenv("SLOTUNE_ADMIN_TOKEN", "from-env")
    assert admin_token(_parse()) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert admin_token(_parse("--admin-token-file", str(token_file))) == "from-file"
