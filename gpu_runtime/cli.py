"""The runtime's command line: `python -m gpu_runtime serve --model PATH [flags]`.

Knob flags are spelled as vLLM spells them (docs/facts.md#flags), so `RuntimeConfig.engine_args()` of the operator
renders one argument list for both engines. Flags this runtime adds: --kv-cache-memory-bytes (the KV budget on CPU),
--max-waiting-requests (admission bound, beyond it 429), --admin-token-file (or env SLOTUNE_ADMIN_TOKEN) and
--num-threads (torch intra-op threads; 1 when sharing a small CPU with clients).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from gpu_runtime.config import KV_CACHE_DTYPES, QUANTIZATIONS
from gpu_runtime.server.metrics import ExtraEdges
from gpu_runtime.speculative.config import SpeculativeSettings, parse_speculative_config

ADMIN_TOKEN_ENV = "SLOTUNE_ADMIN_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpu_runtime", description="slotune's serving runtime.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_arguments(commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API"))
    return parser


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    model = serve.add_argument_group("model")
    model.add_argument("--model", required=True, help="checkpoint directory (config.json, safetensors, tokenizer)")
    model.add_argument("--served-model-name", default=None, help="model id in the API (default: the directory name)")
    model.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    model.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    model.add_argument("--max-model-len", type=int, default=None, help="context length (default: the checkpoint's)")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    knobs = serve.add_argument_group("scheduler and cache knobs (vLLM names)")
    knobs.add_argument("--max-num-seqs", type=int, default=256)
    knobs.add_argument("--max-num-batched-tokens", type=int, default=2048)
    knobs.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    knobs.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    knobs.add_argument("--speculative-config", type=_speculative, default=None,
                       help='JSON, e.g. {"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}')
    knobs.add_argument("--block-size", type=int, default=16)
    knobs.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    knobs.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    knobs.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV cache budget (CPU)")
    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--admin-port", type=int, default=None,
                        help="serve /admin/config on this port only (default: beside the API on --port)")
    server.add_argument("--max-waiting-requests", type=int, default=1024, help="beyond this many queued: 429")
    server.add_argument("--admin-token-file", type=Path, default=None,
                        help=f"bearer token for /admin/config (else env {ADMIN_TOKEN_ENV}; neither: admin disabled)")
    server.add_argument("--slo-bucket-edges", type=_bucket_edges, default=ExtraEdges(), metavar="ttft=S,tpot=S,e2e=S",
                        help="extra histogram edges (seconds) at the SLO targets, so attainment is an exact count")
    server.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    server.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def _speculative(text: str) -> SpeculativeSettings | None:
    """vLLM's --speculative-config JSON (its draft checkpoint key is `model`)."""
    try:
        return parse_speculative_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"invalid --speculative-config: {error}") from error


def _bucket_edges(text: str) -> ExtraEdges:
    try:
        return ExtraEdges.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"invalid --slo-bucket-edges: {error}") from error


def admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_token_file is not None:
        token = args.admin_token_file.read_text().strip()
        if not token:
            raise SystemExit(f"--admin-token-file {args.admin_token_file} is empty")
        return token
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpu_runtime.server.run import serve  # torch and the engine load only when serving

    return serve(args, admin_token(args))
