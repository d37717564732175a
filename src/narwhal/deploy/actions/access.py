"""`narwhal hosts check` as a function: `hostname` on every physical host over SSH, as pinned,
recorded as the `access` activity. `narwhal deploy` runs it first: a re-keyed or unreachable
host stops the run before any gate, since a record that says "fresh" cannot see it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import HostError
from narwhal.deploy.actions.context import Context
from narwhal.deploy.hosts.base import Host


def check_hosts(ctx: Context, say: Callable[[str], None]) -> int:
    """Every host's answer, one line each through `say`; EXIT_FAILED when any is blocked."""
    sessions = ctx.sessions()
    failures = 0
    try:
        with ctx.ledger.attempt("access", fingerprint=ctx.fingerprints()["discover"],
                                hosts=sessions.roles(),
                                deployment_revision=ctx.inputs.revision) as attempt:
            hosts = [sessions.get(alias) for alias in sessions.hosts]
            with attempt.bind(*hosts), ThreadPoolExecutor(max_workers=8) as pool:
                results = list(pool.map(_hostname, hosts))
            for alias, ok, message in results:
                say(f"{alias}: {message}")
                failures += not ok
            if failures:
                attempt.block(f"{failures} host(s) not reachable; see the messages above")
    except HostError:
        return EXIT_FAILED
    finally:
        ctx.close()
    return EXIT_OK


def _hostname(host: Host) -> tuple[str, bool, str]:
    try:
        result = host.run(["hostname"], check=True)
    except HostError as exc:
        return host.alias, False, f"blocked: {exc}"
    return host.alias, True, f"reachable as {result.text.strip()}"
