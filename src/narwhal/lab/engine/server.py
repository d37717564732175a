"""Process lifecycle: settle the plan, start the connector and the HTTP server, serve, stop.

`main(argv)` is the whole program: a bad flag exits 2 (argparse, naming the flag), an engine
that cannot start exits 1 with one clear line, SIGTERM/SIGINT stop it cleanly, SIGUSR1 toggles
the hang fault. An engine whose core dies while serving (engine.py: `do_remote_prefill`
without `remote_block_ids`) answers the request that killed it, shuts down and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq
from aiohttp import web

from narwhal.core.errors import NarwhalError
from narwhal.lab.engine import logs, startup_log
from narwhal.lab.engine.config import EngineConfig, StartupError, parse_config
from narwhal.lab.engine.engine import Engine
from narwhal.lab.engine.engine_plan import EnginePlan, build_plan
from narwhal.lab.engine.faults import EngineFaults
from narwhal.lab.engine.flags import build_parser, normalize_argv
from narwhal.lab.engine.http_app import EngineServer, UvicornAccessLogger, build_app
from narwhal.lab.engine.kv_events_pub import KvEventPublisher
from narwhal.lab.engine.metrics import EngineMetrics
from narwhal.lab.engine.model_dir import load_model_dir
from narwhal.lab.engine.nixl.api import KvConnector
from narwhal.lab.engine.timing import load_timing
from narwhal.lab.engine.tokenizer import Tokenizer

STATS_INTERVAL = 10.0
SECRET_ARGS = ("api_key", "emu_admin_token")  # never printed in the startup log


def load_connector_factory(spec: str) -> Callable[..., KvConnector]:
    """`module:function`; StartupError when the module or function is missing."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StartupError(
            f"argument --kv-transfer-config: the KV connector {spec!r} cannot be imported "
            f"({exc}); the emulator's NIXL side is not installed") from None
    factory = getattr(module, attr or "make_connector", None)
    if not callable(factory):
        raise StartupError(f"argument --emu-connector-factory: {spec!r} is not a callable")
    return cast(Callable[..., KvConnector], factory)


def _non_default(argv: Sequence[str]) -> dict[str, object]:
    parser = build_parser()
    args = vars(parser.parse_args(normalize_argv(list(argv))))
    defaults = vars(parser.parse_args([]))
    shown = {k: v for k, v in args.items() if v != defaults.get(k)}
    for secret in SECRET_ARGS:
        if secret in shown:
            shown[secret] = "***"
    return shown


class Running:
    """A started engine: what shutdown needs."""

    def __init__(self, runner: web.AppRunner, engine: Engine,
                 connector: KvConnector | None, publisher: KvEventPublisher | None) -> None:
        self.runner = runner
        self.engine = engine
        self.connector = connector
        self.publisher = publisher

    async def stop(self) -> None:
        self.engine.unpark()  # parked requests would hold the HTTP shutdown for its timeout
        await self.runner.cleanup()
        await self.engine.stop()
        if self.connector is not None:
            await self.connector.stop()
        if self.publisher is not None:
            self.publisher.close()


def _publisher(cfg: EngineConfig) -> KvEventPublisher | None:
    events = cfg.kv_events
    if events is None:
        return None
    try:
        return KvEventPublisher(events, cfg.data_parallel_rank)
    except zmq.ZMQError as exc:
        raise StartupError(f"argument --kv-events-config: cannot open {events.endpoint}: "
                           f"{exc}") from None


async def start(cfg: EngineConfig, plan: EnginePlan, tokenizer: Tokenizer,
                log: logging.Logger) -> Running:
    """Build and start everything; returns once the port accepts connections."""
    began = time.monotonic()
    faults = EngineFaults()
    metrics = EngineMetrics(cfg, plan, with_nixl=cfg.kv_transfer_config is not None)
    connector: KvConnector | None = None
    if cfg.kv_transfer_config is not None and cfg.kv_transfer_config.get("kv_connector"):
        factory = load_connector_factory(cfg.emu.connector_factory)
        try:
            connector = factory(cfg, plan.geometry, metrics, faults, log)
            await connector.start()
        except NarwhalError as exc:
            raise StartupError(f"argument --kv-transfer-config: {exc}") from None
    publisher = _publisher(cfg)
    engine = Engine(cfg, plan, tokenizer, load_timing(cfg.emu), metrics, faults, connector, log,
                    None if publisher is None else publisher.add)
    startup_log.log_kv_cache(log, cfg, plan, time.monotonic() - began)
    engine.start()
    server = EngineServer(engine, log)
    app = build_app(server, dev_mode=cfg.env.get("VLLM_SERVER_DEV_MODE") == "1")
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=log if cfg.serve.access_log else None,
        access_log_class=UvicornAccessLogger)
    await runner.setup()
    host = cfg.serve.host or "0.0.0.0"  # noqa: S104 - vLLM's default binds every interface
    site = web.TCPSite(runner, cfg.serve.host, cfg.serve.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await engine.stop()
        if connector is not None:
            await connector.stop()
        if publisher is not None:
            publisher.close()
        raise StartupError(f"argument --port: cannot bind {host}:{cfg.serve.port}: {exc}") from None
    startup_log.log_serving(log, host, cfg.serve.port)
    return Running(runner, engine, connector, publisher)


async def _stats(log: logging.Logger, engine: Engine) -> None:
    """vLLM's periodic `Engine 000: Avg prompt throughput ...` line, only after activity."""
    counters = engine.scheduler.counters
    last_tokens = counters["tokens"]
    label = "CPU" if engine.cfg.emu.platform == "cpu" else "GPU"
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        tokens = counters["tokens"]
        s = engine.scheduler
        if tokens == last_tokens and not s.running and not s.waiting:
            continue
        usage = 100.0 * (s.num_blocks - s.free_blocks) / max(s.num_blocks, 1)
        log.info("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
                 "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, %s KV cache usage: %.1f%%",
                 (tokens - last_tokens) / STATS_INTERVAL, len(s.running), len(s.waiting), label,
                 usage, extra=logs.at("loggers.py:259"))
        last_tokens = tokens


async def serve(cfg: EngineConfig, plan: EnginePlan, tokenizer: Tokenizer,
                log: logging.Logger) -> int:
    """Run until SIGTERM/SIGINT (exit status 0) or the engine core's death (1)."""
    running = await start(cfg, plan, tokenizer, log)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    running.engine.on_dead = stop.set
    faults = running.engine.faults
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: faults.set_hung(not faults.hung))
    stats: asyncio.Task[Any] | None = None
    if not cfg.args.disable_log_stats:
        stats = loop.create_task(_stats(log, running.engine))
    await stop.wait()
    log.info("Shutting down", extra=logs.uvicorn())
    if stats is not None:
        stats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stats
    faults.set_hung(False)
    await running.stop()
    log.info("Application shutdown complete.", extra=logs.uvicorn())
    log.info("Finished server process [%d]", os.getpid(), extra=logs.uvicorn())
    return 1 if running.engine.dead else 0


def prepare(argv: Sequence[str], env: dict[str, str],
            log: logging.Logger) -> tuple[EngineConfig, EnginePlan, Tokenizer]:
    """Everything decided before the event loop starts (flags, model dir, KV plan)."""
    cfg = parse_config(list(argv), env)
    startup_log.log_config(log, cfg, _non_default(argv[1:] if argv and argv[0] == "serve"
                                                  else argv))
    model = load_model_dir(cfg.model_dir)
    plan = build_plan(cfg, model)
    try:
        tokenizer = Tokenizer(model.vocab_size, model.special)
    except ValueError as exc:
        raise StartupError(f"{cfg.model_dir / 'config.json'}: {exc}") from None
    archs = model.config.get("architectures") or [model.config.get("model_type", "unknown")]
    startup_log.log_engine(log, cfg, plan, str(archs[0]))
    return cfg, plan, tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    log = logs.setup()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, plan, tokenizer = prepare(args, dict(os.environ), log)
        _use_uvloop()
        return asyncio.run(serve(cfg, plan, tokenizer, log))
    except StartupError as exc:
        log.error("Engine failed to start: %s", exc, extra=logs.at("api_server.py:2090"))
        return 1


def _use_uvloop() -> None:
    """uvloop when it is installed (it is not a dependency): cheaper per request."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
