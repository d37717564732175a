"""Progress on stderr while engines are measured: a live bar per engine on a terminal, plain
lines otherwise (a log or a CI job must not fill with cursor codes). stdout stays for the result.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class Reporter(Protocol):
    def __enter__(self) -> Reporter: ...
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def update(self, engine_id: str, phase: str, done: int, total: int) -> None: ...


class PlainLines:
    """`narwhal-profile: eng1 prefill 3/24 (1.2 s)` when a phase starts or ends, and at most
    every few seconds in between, so a log shows progress without a line per sample."""

    EVERY_S = 5.0

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.last: dict[str, tuple[str, float]] = {}

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def update(self, engine_id: str, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        last_phase, last_at = self.last.get(engine_id, ("", 0.0))
        if phase == last_phase and done < total and now - last_at < self.EVERY_S:
            return
        self.last[engine_id] = (phase, now)
        print(f"narwhal-profile: {engine_id} {phase} {done}/{total} "
              f"({time.monotonic() - self.started:.1f} s)", file=self.stream, flush=True)


class Bars:
    """A rich progress bar per engine."""

    def __init__(self, engine_ids: tuple[str, ...]) -> None:
        self.progress = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True))
        self.ids = engine_ids
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Bars:
        self.progress.start()
        self.tasks = {eid: self.progress.add_task(eid, total=1) for eid in self.ids}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()

    def update(self, engine_id: str, phase: str, done: int, total: int) -> None:
        self.progress.update(self.tasks[engine_id], description=f"{engine_id} {phase}",
                             completed=done, total=max(total, 1))


def reporter(engine_ids: tuple[str, ...]) -> Reporter:
    return Bars(engine_ids) if sys.stderr.isatty() else PlainLines(sys.stderr)
