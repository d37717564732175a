"""`narwhal kv`: predict KV geometry, NIXL hash and fabric budget; explain pair compatibility.

    narwhal kv plan --config config.json --model ORG/NAME --tp 8 [--json]
    narwhal kv pair A.json B.json [--json]      (A/B written by `kv plan --json`)

Exit codes: 0 ok / compatible, 1 incompatible, 2 bad input. All arithmetic lives in
narwhal.core.kv; this module only reads files, builds the plan and renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.document_io import problems_from, read_json_document
from narwhal.core.documents import canonical_json
from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.budget import Workload, edge_budget
from narwhal.core.kv.document import REFERENCE, load_plan_document, plan_document
from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.pair import PairReport, check_pair
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.transfer import request_transfer

Flags = tuple[tuple[str, str, type, str], ...]
_PLAN_FLAGS: Flags = (
    ("--name", "name", str, "engine name used in pair findings"),
    ("--model", "model", str, "the exact --model string the engine is launched with (hashed)"),
    ("--vllm-version", "vllm_version", str, "vLLM version string (default 0.29.0)"),
    ("--dtype", "dtype", str, "--dtype: auto, bfloat16, float16, float32"),
    ("--tp", "tensor_parallel_size", int, "tensor-parallel size"),
    ("--pp", "pipeline_parallel_size", int, "pipeline-parallel size"),
    ("--dp", "data_parallel_size", int, "data-parallel size"),
    ("--block-size", "block_size", int, "--block-size (default: the backend's)"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "--kv-cache-dtype (hashed literally)"),
    ("--attention-backend", "attention_backend", str, "attention backend name"),
    ("--kv-cache-layout", "kv_cache_layout", str, "VLLM_KV_CACHE_LAYOUT override"),
    ("--transfer-mode", "transfer_mode", str, "pull (NixlConnector) or push"),
    ("--ssm-conv-state-layout", "ssm_conv_state_layout", str, "VLLM_SSM_CONV_STATE_LAYOUT"),
    ("--max-model-len", "max_model_len", int, "max model length, for capacity"),
    ("--available-kv-bytes", "available_kv_bytes", int, "KV bytes per rank, for capacity"),
)
_WORKLOAD_FLAGS: Flags = (
    ("--prompt-tokens", "prompt_tokens", int, "prompt tokens per handoff (default 1024)"),
    ("--handoffs-per-s", "handoffs_per_s", float, "handoffs per second (default 1)"),
    ("--burst", "burst", int, "handoffs arriving together (default 1)"),
    ("--transfer-budget-s", "transfer_budget_s", float, "seconds a burst may take (default 1)"),
    ("--headroom", "headroom", float, "multiplier >= 1 (default 1.25)"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kv", help="predict KV geometry, NIXL hash and fabric budget from a config")
    kv = p.add_subparsers(dest="kv_command", metavar="KV_COMMAND")
    kv.required = True
    plan = kv.add_parser("plan", help="geometry, compatibility hash and budget for one engine")
    plan.add_argument("--config", required=True, help="the model's Hugging Face config.json")
    for flag, dest, kind, text in (*_PLAN_FLAGS, *_WORKLOAD_FLAGS):
        plan.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    hma = plan.add_mutually_exclusive_group()
    hma.add_argument("--disable-hybrid-kv-cache-manager", dest="hma_off", action="store_const",
                     const=True, default=None, help="HMA off (hashed)")
    hma.add_argument("--no-disable-hybrid-kv-cache-manager", dest="hma_off",
                     action="store_const", const=False, help="HMA explicitly on")
    plan.add_argument("--no-enable-prefix-caching", dest="prefix", action="store_false",
                      default=True, help="prefix caching off")
    plan.add_argument("--speculative-config", default=None, help="--speculative-config JSON")
    plan.add_argument("--json", action="store_true", help="print the narwhal.kv-plan document")
    plan.set_defaults(handler=_plan)
    pair = kv.add_parser("pair", help="explain whether two planned engines can hand off KV")
    pair.add_argument("first", help="kv-plan document (from `narwhal kv plan --json`)")
    pair.add_argument("second", help="kv-plan document of the other engine")
    pair.add_argument("--prompt-tokens", type=int, default=1024, help="tokens per handoff")
    pair.add_argument("--json", action="store_true", help="machine-readable verdicts")
    pair.set_defaults(handler=_pair)


def _flag_problems(exc: ValidationError, model: type[BaseModel], flags: Flags) -> list[Problem]:
    """The document translator's problems, each under the flag the user typed and the field
    that flag sets (`--tp (tensor_parallel_size)`)."""
    flag_of = {dest: flag for flag, dest, _kind, _text in flags}
    flag_of["speculative"] = "--speculative-config"
    out = []
    for p in problems_from(exc, model, reference=REFERENCE):
        flag = flag_of.get(p.field.split(".")[0].split("[")[0])
        out.append(Problem(f"{flag} ({p.field})", p.problem, p.fix) if flag else p)
    return out


def _picked(args: argparse.Namespace, flags: Flags) -> dict[str, Any]:
    return {dest: getattr(args, dest) for _f, dest, _k, _t in flags
            if getattr(args, dest) is not None}


def _build_plan(args: argparse.Namespace) -> LaunchPlan:
    fields = _picked(args, _PLAN_FLAGS)
    problems: list[Problem] = []
    if "model" not in fields:
        problems.append(Problem("--model", "is required: vLLM hashes the --model string verbatim",
                                "pass the exact --model the engines are launched with"))
    if args.speculative_config is not None:
        try:
            fields["speculative"] = json.loads(args.speculative_config)
        except ValueError as exc:
            problems.append(Problem("--speculative-config", f"is not JSON: {exc}",
                                    "pass a JSON object"))
    fields["disable_hybrid_kv_cache_manager"] = args.hma_off
    fields["enable_prefix_caching"] = args.prefix
    if problems:
        raise InputError("narwhal kv plan", problems)
    try:
        return LaunchPlan.model_validate(fields)
    except ValidationError as exc:
        raise InputError("narwhal kv plan", _flag_problems(exc, LaunchPlan, _PLAN_FLAGS)) from None


def _workload(fields: dict[str, Any]) -> Workload:
    try:
        return Workload.model_validate(fields)
    except ValidationError as exc:
        raise InputError("workload", _flag_problems(exc, Workload, _WORKLOAD_FLAGS)) from None


def _plan(args: argparse.Namespace) -> int:
    config = read_json_document(Path(args.config), "pass the model's config.json (--config)")
    if not isinstance(config, dict):
        raise InputError(args.config, [Problem("--config", "is not a JSON object",
                                               "pass the model's config.json")])
    plan = _build_plan(args)
    workload = _workload(_picked(args, _WORKLOAD_FLAGS))
    geometry = plan_geometry(config, plan)
    document = plan_document(config, geometry, workload)
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        _render_plan(document, geometry)
    return EXIT_OK


def _render_plan(document: dict[str, Any], g: Geometry) -> None:
    stage = g.stages[0]
    lens = stage.metadata.block_lens
    req, budget = document["request"], document["budget"]
    table = Table(title=f"KV plan: {g.engine} (vLLM {g.plan.vllm_version}, TP {g.tp}, PP {g.pp})")
    table.add_column("quantity")
    table.add_column("value", overflow="fold")
    arch = g.architecture
    rows = [
        ("layers / KV heads / head size", f"{arch.num_hidden_layers} / {arch.num_kv_heads} / "
                                          f"{arch.head_size}{' (MLA)' if arch.is_mla else ''}"),
        ("layer kinds", ", ".join(f"{k}: {n}" for k, n in arch.layer_kinds.items())),
        ("KV heads per rank", str(g.heads_per_rank)),
        ("bytes / token / layer / rank", f"{g.bytes_per_token_per_layer:,}"),
        ("bytes / token / rank", f"{stage.bytes_per_token:,}"),
        ("block size (kernel, r)", f"{g.block_size} ({g.kernel_block_size}, "
                                   f"{g.physical_per_logical})"),
        ("groups", "; ".join(f"{x.kind} x{len(x.layers)} page {x.page_bytes:,}" for x in g.groups)),
        ("bytes / block / rank", f"{stage.bytes_per_block:,}"),
        ("layout", f"{g.kv_cache_layout} ({g.layout_reason})"),
        ("NIXL regions x block_len", f"{stage.metadata.num_regions} x "
                                     f"{lens[0] if lens else 0:,}"),
        (f"bytes / rank, {req['prompt_tokens']} tokens", f"{req['stages'][0]['bytes_per_rank']:,}"),
        ("bytes, all ranks", f"{req['total_bytes']:,}"),
        ("HMA enabled", str(g.hma_enabled)),
        ("compatibility hash", g.compatibility_hash),
        ("required Gbit/s per directed edge", f"{budget['required_gbps']:.6g}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    Console(file=sys.stdout, width=140).print(table)


def _pair(args: argparse.Namespace) -> int:
    fix = "pass a document written by `narwhal kv plan --json`"
    _, first = load_plan_document(read_json_document(Path(args.first), fix), args.first)
    _, second = load_plan_document(read_json_document(Path(args.second), fix), args.second)
    if first.engine == second.engine:
        raise InputError(args.second, [Problem("engine", f"both documents name {first.engine!r}",
                                               "give each engine its own --name")])
    if args.prompt_tokens < 1:
        raise InputError("narwhal kv pair", [Problem("--prompt-tokens", "must be >= 1",
                                                     "pass a positive token count")])
    reports = [check_pair(first, second), check_pair(second, first)]
    consumers = {first.engine: first, second.engine: second}
    if args.json:
        out = [{"producer": r.producer, "consumer": r.consumer, "compatible": r.compatible,
                "hash_equal": r.hash_equal, "tp_ratio": r.tp_ratio,
                "bytes_per_handoff": request_transfer(consumers[r.consumer],
                                                      args.prompt_tokens).total_bytes,
                "findings": [f.model_dump(mode="json") for f in r.findings]} for r in reports]
        print(canonical_json(out))
    else:
        for report in reports:
            _render_pair(report, consumers[report.consumer], args.prompt_tokens)
    return EXIT_OK if all(r.compatible for r in reports) else EXIT_FAILED


def _render_pair(report: PairReport, consumer: Geometry, tokens: int) -> None:
    head = f"{report.producer} -> {report.consumer}"
    if report.compatible:
        moved = request_transfer(consumer, tokens).total_bytes
        gbps = edge_budget(consumer, Workload(prompt_tokens=tokens)).required_gbps
        print(f"{head}: compatible (hash equal, TP ratio {report.tp_ratio}); "
              f"{moved:,} bytes per {tokens}-token handoff, {gbps:.6g} Gbit/s at the default load")
        return
    print(f"{head}: INCOMPATIBLE ({len(report.findings)} finding(s))")
    for f in report.findings:
        print(f"  - [{f.check}] {f.message}\n    fix: {f.fix}")
