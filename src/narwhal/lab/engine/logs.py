"""Log lines in vLLM's own format, so the parsers written for real engine logs read ours too.

vLLM prints `LEVEL MM-DD HH:MM:SS [file.py:line] message`, prefixed by the process that wrote
it (`(APIServer pid=N)` or `(EngineCore_DP0 pid=N)`). The emulator is one process, but its lines
claim the vLLM source location and process role the real line comes from, because readers
(core/kv's `parse_startup_log`, operators grepping for a known line) key on the message text and
sometimes on the file name. Any code in the emulator, the NIXL side included, logs through the
`narwhal.lab.engine` logger and picks the claimed source with
`extra=at("base_worker.py:640", ENGINE_CORE)`; without it the real file and line are printed.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, TextIO

LOGGER_NAME = "narwhal.lab.engine"
API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore_DP0"
_UVICORN = "uvicorn"


def at(source: str, process: str = API_SERVER) -> dict[str, Any]:
    """`extra=` for a log call: the vLLM file:line and process the line is attributed to."""
    return {"vllm_at": source, "vllm_proc": process}


def uvicorn() -> dict[str, Any]:
    """`extra=` for uvicorn's own lines (`INFO:     Application startup complete.`)."""
    return {"vllm_proc": API_SERVER, "vllm_at": _UVICORN}


class VllmFormatter(logging.Formatter):
    """`(Proc pid=N) INFO MM-DD HH:MM:SS [file.py:line] message`, or uvicorn's `INFO:     msg`."""

    def __init__(self) -> None:
        super().__init__()
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        proc = getattr(record, "vllm_proc", API_SERVER)
        source = getattr(record, "vllm_at", None) or f"{record.filename}:{record.lineno}"
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        prefix = f"({proc} pid={self._pid}) "
        if source == _UVICORN:
            return f"{prefix}{record.levelname + ':':<9} {message}"
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(record.created))
        return f"{prefix}{record.levelname} {stamp} [{source}] {message}"


def setup(stream: TextIO | None = None, level: int = logging.INFO) -> logging.Logger:
    """The emulator's logger, writing vLLM-formatted lines to stderr (once per process)."""
    log = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_narwhal_engine", False) for h in log.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(VllmFormatter())
        handler._narwhal_engine = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return log


def thousands(value: int) -> str:
    """`1,048,576`: vLLM prints token counts with thousands separators."""
    return f"{value:,}"
