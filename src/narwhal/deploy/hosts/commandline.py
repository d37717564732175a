"""The one place remote command lines are built: argv lists in, quoted text out.

Fixed POSIX helpers (write a file exclusively, start a detached process, read a process start
time) are argv lists whose script part is a constant; every variable part travels as a
positional argument, so nothing a user wrote is ever parsed by a remote shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from narwhal.deploy.hosts.relay_scripts import RELAY_FETCH, RELAY_SERVE

# Put stdin at $2 in one round trip: written to the new part file $1 (login-only), checked
# against sha256 $3, then linked into place ($4 = link: never replacing a file) or moved over
# it ($4 = replace); the part file never survives. $5 = private-folder makes its folder first
# (and its parents), readable by the login only. Prints "<inode> <sha256>" of what is at $2
# afterwards (for `link`, an existing file's own digest, which the caller compares). Exit 10:
# the part file could not be written or moved; 11: the data arrived changed (its digest
# printed); 12: $2 is not a regular file afterwards.
PUT_FILE = (
    'part=$1; path=$2; want=$3\n'
    'if [ "$5" = private-folder ]; then d=$(dirname -- "$path")\n'
    '  ( umask 077 && mkdir -p -- "$d" && chmod 700 -- "$d" ) || exit 10; fi\n'
    '( umask 077 && set -C && cat > "$part" ) || { rm -f -- "$part"; exit 10; }\n'
    's=$(sha256sum -- "$part") || { rm -f -- "$part"; exit 10; }; s=${s%% *}\n'
    'if [ "$s" != "$want" ]; then rm -f -- "$part"; echo "$s"; exit 11; fi\n'
    'if [ "$4" = replace ]; then mv -f -T -- "$part" "$path" || { rm -f -- "$part"; exit 10; }\n'
    'elif ln -T -- "$part" "$path" 2>/dev/null; then rm -f -- "$part"\n'
    '  i=$(stat -c %i -- "$path") && echo "$i $want"; exit\n'
    'else rm -f -- "$part"; fi\n'
    '[ -f "$path" ] && [ ! -L "$path" ] || exit 12\n'
    'i=$(stat -c %i -- "$path") && s=$(sha256sum -- "$path") && echo "$i ${s%% *}"\n')
# Print bytes [$2, $2+$3) of file $1 (a relayed checkpoint file, a piece at a time).
READ_RANGE = 'exec dd if="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" count="$3" status=none'
# The first $2 bytes of file $1, then of $3 the first $4, and so on, back to back.
READ_HEADS = 'while [ "$#" -ge 2 ]; do head -c "$2" -- "$1" || exit; shift 2; done'
# Append stdin to $1, readable by every login (an engine's container reads the checkpoint).
APPEND_SHARED = 'umask 022 && cat >> "$1"'
# Move $1 over $2, making $2's folder first.
MOVE_INTO_PLACE = 'mkdir -p -- "$(dirname -- "$2")" && mv -f -- "$1" "$2"'
# Start "$@" in its own session, output to $1, print its pid, then its /proc stat line (the
# kernel start time, fixed at fork) in the same round trip.
START_DETACHED = ('log="$1"; shift; setsid "$@" >"$log" 2>&1 </dev/null & p=$!; echo "$p"; '
                  'cat "/proc/$p/stat" 2>/dev/null; exit 0')
# Print "<inode> <sha256>" of a regular file, or nothing when absent.
STAT_FILE = '[ -f "$1" ] && [ ! -L "$1" ] || exit 3; i=$(stat -c %i -- "$1") && ' \
    's=$(sha256sum -- "$1") && echo "$i ${s%% *}"'
# Run "$@" in the directory $1.
IN_DIR = 'cd "$1" && shift && exec "$@"'
# Make the directory $1 (and its parents) readable by the login only.
PRIVATE_DIR = 'umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1"'
# Print "<inode>" of a directory, or exit 3.
STAT_DIR = '[ -d "$1" ] && [ ! -L "$1" ] || exit 3; stat -c %i -- "$1"'


def check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """Reject argv that cannot be sent faithfully (non-strings, NUL bytes, empty)."""
    if not argv:
        raise ValueError("empty command")
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"argv items must be str, got {type(arg).__name__}")
        if "\x00" in arg:
            raise ValueError("argv items cannot contain NUL")
    return tuple(argv)


def remote_line(argv: Sequence[str]) -> str:
    """Quote argv once for the remote login shell."""
    return shlex.join(check_argv(argv))


def sh(script: str, *args: str) -> list[str]:
    """argv for a constant POSIX script with positional arguments."""
    return ["sh", "-c", script, "sh", *args]



# One host's link facts in one round trip: `ip -j addr show dev IFACE`, `ip -j route get PEER
# from SELF` per peer, then the first line of each tool's `--version`; every section is ended
# by a line `@@ <exit status>` (parse_sections).
LINK_FACTS = ('iface=$1; self=$2; shift 2\n'
              'ip -j addr show dev "$iface"; echo "@@ $?"\n'
              'while [ "$1" != -- ]; do ip -j route get "$1" from "$self"; echo "@@ $?"; shift; done\n'
              'shift\n'
              'for tool in "$@"; do v=$("$tool" --version 2>/dev/null); rc=$?\n'
              '  printf "%s\\n" "$v" | head -n 1; echo "@@ $rc"; done\n')
SECTION_END = re.compile(r"^@@ (\d+)$")


def link_facts(interface: str, address: str, peers: Sequence[str],
               tools: Sequence[str]) -> list[str]:
    return sh(LINK_FACTS, interface, address, *peers, "--", *tools)


def parse_sections(text: str) -> list[tuple[int, str]]:
    """A sectioned output (each section ended by `@@ <exit status>`): (status, text) each."""
    out: list[tuple[int, str]] = []
    lines: list[str] = []
    for line in text.splitlines():
        end = SECTION_END.match(line)
        if end:
            out.append((int(end[1]), "\n".join(lines)))
            lines = []
        else:
            lines.append(line)
    return out


def relay_server(bind: str, token: str, idle_s: float, max_s: float, base: str,
                 files: Sequence[tuple[str, str]]) -> list[str]:
    """Serve `files` ((sha256, path under base) each) to the hosts below this one in Gate B's
    relay tree (relay_scripts.RELAY_SERVE; its first output line is `port <n>`)."""
    pairs = [f"{digest}={path}" for digest, path in files]
    return ["python3", "-c", RELAY_SERVE, bind, token, f"{idle_s:g}", f"{max_s:g}", base,
            *pairs]


def relay_fetch(url: str, base: str, timeout_s: float, deadline_s: float) -> list[str]:
    """Pull the files listed on stdin from a relaying host into base
    (relay_scripts.RELAY_FETCH)."""
    return ["python3", "-c", RELAY_FETCH, url, base, f"{timeout_s:g}", f"{deadline_s:g}"]


# Runs a Python program sent ahead of its own input on stdin: a first line with the program's
# length in bytes, the program, then what the program itself reads from stdin. Nothing is
# written on the host, so nothing is left there if the run is cut.
STDIN_PROGRAM = (
    "import sys, types\n"
    "size = int(sys.stdin.buffer.readline())\n"
    "data = sys.stdin.buffer.read(size)\n"
    "if len(data) != size:\n"
    "    sys.exit(f'{sys.argv[1]}: stdin ended after {len(data)} of {size} bytes')\n"
    "code = compile(data, sys.argv[1], 'exec')\n"
    "main = types.ModuleType('__main__')\n"
    "main.__file__ = sys.argv[1]\n"
    "sys.modules['__main__'] = main\n"
    "exec(code, main.__dict__)\n")


def stdin_program(name: str) -> list[str]:
    """argv that runs a program given on stdin (stdin_program_input) under `name`."""
    return ["python3", "-c", STDIN_PROGRAM, name]


def stdin_program_input(code: bytes, rest: bytes) -> bytes:
    return f"{len(code)}\n".encode() + code + rest


def read_range(path: str, offset: int, length: int) -> list[str]:
    return sh(READ_RANGE, path, str(int(offset)), str(int(length)))


def append_shared(path: str) -> list[str]:
    return sh(APPEND_SHARED, path)


def move_into_place(part: str, path: str) -> list[str]:
    return sh(MOVE_INTO_PLACE, part, path)


def start_detached(log_path: str, argv: Sequence[str]) -> list[str]:
    return sh(START_DETACHED, log_path, *check_argv(argv))


def put_file(part: str, path: str, sha256: str, *, replace: bool,
             private_folder: bool = False) -> list[str]:
    return sh(PUT_FILE, part, path, sha256, "replace" if replace else "link",
              "private-folder" if private_folder else "")


def stat_file(path: str) -> list[str]:
    return sh(STAT_FILE, path)


def stat_dir(path: str) -> list[str]:
    return sh(STAT_DIR, path)


def sha256_file(path: str) -> list[str]:
    return ["sha256sum", "--", path]


def read_file(path: str) -> list[str]:
    return ["cat", "--", path]


def file_size(path: str) -> list[str]:
    """Print a file's length in bytes (fails when it is absent)."""
    return ["stat", "-c", "%s", "--", path]


def read_from(path: str, offset: int) -> list[str]:
    """A file's bytes from `offset` on (the part appended since a size was read)."""
    return ["tail", "-c", f"+{int(offset) + 1}", "--", path]


def read_heads(files: Sequence[tuple[str, int]]) -> list[str]:
    """The first `size` bytes of each (path, size), one after another on stdout."""
    args = [a for path, size in files for a in (path, str(int(size)))]
    return sh(READ_HEADS, *args)


def read_head(path: str, limit: int) -> list[str]:
    """At most `limit` bytes of a file from its start: a transfer bounded whatever it holds."""
    return ["head", "-c", str(int(limit)), "--", path]


# Run "$@" and print at most $1 bytes of its output, keeping its own exit status (a pipe into
# head would report head's). A snapshot of a busy host stays bounded in the record.
BOUNDED_OUTPUT = 'n="$1"; shift; out=$("$@"); s=$?; printf "%s\\n" "$out" | head -c "$n"; ' \
    'exit "$s"'


def bounded_output(limit: int, argv: Sequence[str]) -> list[str]:
    return sh(BOUNDED_OUTPUT, str(int(limit)), *check_argv(argv))


def ip_addresses() -> list[str]:
    """Every interface with its addresses, as JSON."""
    return ["ip", "-j", "address", "show"]


def ip_routes(family: int = 4) -> list[str]:
    """The main routing table of one address family (4 or 6), as JSON."""
    return ["ip", "-j", f"-{4 if family == 4 else 6}", "route", "show"]


def tcp_sockets() -> list[str]:
    """Every TCP socket, numeric, with its process where the login may see it."""
    return ["ss", "-tanp"]


def proc_stat(pid: int) -> list[str]:
    return ["cat", f"/proc/{int(pid)}/stat"]


def parse_start_ticks(stat_line: str) -> int:
    """Field 22 (starttime) of /proc/<pid>/stat; the command name may contain ') '."""
    after = stat_line.rsplit(")", 1)[1].split()
    return int(after[19])


# Container runtimes whose CLI speaks `inspect --format` and `rm -f` the same way.
CONTAINER_RUNTIMES = ("docker", "podman")
# A full container id; a name or short prefix could later resolve to another container.
CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")
# The id and creation time a container is known by; the Go template is the same for both.
CONTAINER_IDENTITY_FORMAT = "{{.Id}} {{.Created}}"


def _container(runtime: str, container_id: str) -> tuple[str, str]:
    if runtime not in CONTAINER_RUNTIMES:
        raise ValueError(f"container runtime {runtime!r} is not one of "
                         + ", ".join(CONTAINER_RUNTIMES))
    if not CONTAINER_ID_RE.fullmatch(container_id):
        raise ValueError(f"container id {container_id[:80]!r} is not a full 64-hex id")
    return runtime, container_id


def container_identity(runtime: str, container_id: str) -> list[str]:
    """Print "<id> <created>" of one container (`--type container`: never an image's)."""
    runtime, container_id = _container(runtime, container_id)
    return [runtime, "inspect", "--type", "container", "--format", CONTAINER_IDENTITY_FORMAT,
            container_id]


def container_remove(runtime: str, container_id: str) -> list[str]:
    """Stop (if running) and remove one container."""
    runtime, container_id = _container(runtime, container_id)
    return [runtime, "rm", "-f", container_id]


def parse_container_identity(text: str) -> tuple[str, str]:
    """(id, created) from container_identity's output; podman's created time holds spaces."""
    container_id, _, created = text.strip().partition(" ")
    if not CONTAINER_ID_RE.fullmatch(container_id) or not created:
        raise ValueError(f"not `{CONTAINER_IDENTITY_FORMAT}` output: {text.strip()[:120]!r}")
    return container_id, created


# --- Gate B: the install steps on a host (every variable part a positional argument) -------

# Take the install lock $1 with owner text $2: written aside, then hard-linked into place, so
# the lock appears whole or not at all. Exit 3 and print the holder when it is held.
LOCK_TAKE = ('umask 077; t="$1.$$"; printf "%s\\n" "$2" > "$t" || exit 1; '
             'if ln -- "$t" "$1" 2>/dev/null; then rm -f -- "$t"; exit 0; fi; '
             'rm -f -- "$t"; cat -- "$1"; exit 3')
# Remove lock $1 only while its owner text is still $2 (never someone else's lock).
LOCK_DROP = '[ "$(cat -- "$1" 2>/dev/null)" = "$2" ] && rm -f -- "$1"; exit 0'
# Clone bundle $2 (branch $3) to $1 through a part folder, so a cut clone leaves no checkout.
CLONE = ('rm -rf -- "$1.part" && git clone -q --branch "$3" -- "$2" "$1.part" && '
         'mv -- "$1.part" "$1"')
# Print "<HEAD> <changed path count>" of the checkout $1.
CHECKOUT_STATE = 'h=$(git -C "$1" rev-parse HEAD) && n=$(git -C "$1" status --porcelain | ' \
    'wc -l) && echo "$h $n"'
# Print the venv $1's completion stamp, or nothing.
VENV_STAMP = 'cat -- "$1/.narwhal-complete" 2>/dev/null; exit 0'
# A fresh venv at $1 (an incomplete one from a cut attempt is removed first).
VENV_CREATE = 'rm -rf -- "$1" && python3 -m venv -- "$1"'
# Write text $2 to $1 through a part file (a marker is whole or absent).
WRITE_MARKER = 'umask 077; printf "%s\\n" "$2" > "$1.part" && mv -f -- "$1.part" "$1"'
# Print "$HOME": remote paths are absolute from here on.
HOME = 'printf "%s" "$HOME"'


def lock_take(path: str, owner: str) -> list[str]:
    return sh(LOCK_TAKE, path, owner)


def lock_drop(path: str, owner: str) -> list[str]:
    return sh(LOCK_DROP, path, owner)


def clone_bundle(checkout: str, bundle: str, branch: str) -> list[str]:
    return sh(CLONE, checkout, bundle, branch)


def checkout_state(checkout: str) -> list[str]:
    return sh(CHECKOUT_STATE, checkout)


def venv_stamp(venv: str) -> list[str]:
    return sh(VENV_STAMP, venv)


def venv_create(venv: str) -> list[str]:
    return sh(VENV_CREATE, venv)


def pip_install_offline(venv: str, wheel_dirs: Sequence[str], requirements: str) -> list[str]:
    """pip from the wheel folders only, every wheel hash-checked: no index is ever asked."""
    links = [arg for d in wheel_dirs for arg in ("--find-links", d)]
    return [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "--no-index",
            "--no-cache-dir", "--disable-pip-version-check", "--require-hashes",
            "--only-binary=:all:", *links, "-r", requirements]


def write_marker(path: str, text: str) -> list[str]:
    return sh(WRITE_MARKER, path, text)


def in_dir(path: str, argv: Sequence[str]) -> list[str]:
    return sh(IN_DIR, path, *check_argv(argv))


def private_dir(path: str) -> list[str]:
    return sh(PRIVATE_DIR, path)


def home() -> list[str]:
    return sh(HOME)

# A role shell: in the installed checkout $1/checkout, the role file $2 loaded (exported), the
# venv active; then the login's interactive shell, or the command "$@" after the two.
ROLE_SHELL = ('cd "$1/checkout" && set -a && . "$2" && set +a && . "$1/venv/bin/activate" && '
              'shift 2 && if [ "$#" -eq 0 ]; then exec "${SHELL:-/bin/sh}" -i; else exec "$@"; fi')


def role_shell(install_dir: str, role_env: str, argv: Sequence[str] = ()) -> list[str]:
    return sh(ROLE_SHELL, install_dir, role_env, *check_argv(argv) if argv else ())
