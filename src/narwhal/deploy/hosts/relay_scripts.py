"""The two Python programs Gate B's relay runs on the hosts, as constant source text.

They run with the host's own `python3` (Gate A checked it against the lock) before Narwhal is
installed there, so they use the standard library only. Every variable part (address, token,
folder, file list) arrives as an argument or on stdin; commandline.py builds the argv.

RELAY_SERVE serves files a host already holds, by sha256 only, to the hosts below it in the
relay tree: `GET /<token>/<sha256>` answers the file the workstation listed under that digest
and nothing else (no listing, no path from the request is ever opened). It prints
`port <n>` once it listens and exits by itself after `idle_s` without a request or `max_s` in
all, so a workstation that dies mid-install leaves nothing serving for long.

RELAY_FETCH pulls the listed files (`<sha256> <size> <path>` lines on stdin) from a serving
host into a folder, each into a private part file that is checked for size and sha256 and
then hard-linked into place, never over an existing file. It prints one line per file:
`created <inode> <path>`, `kept - <path>` (already there with that digest), `refused - <path>`
(something else is there: left as it is) or `failed <why> <path>`; with the URL `-` it pulls
nothing and says `missing - <path>` for each file not there (a rerun's check, which needs no
parent); after the first failure to
reach the server, or once `deadline_s` has passed, the rest fail without being asked for, and
the workstation sends them itself.
"""

from __future__ import annotations

RELAY_SERVE = r'''
import os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
bind, token, idle_s, max_s, base = sys.argv[1], sys.argv[2], float(sys.argv[3]), \
    float(sys.argv[4]), sys.argv[5]
files = {}
for pair in sys.argv[6:]:
    digest, _, rel = pair.partition("=")
    files[digest] = os.path.join(base, rel)
last = [time.monotonic()]

class Files(BaseHTTPRequestHandler):
    timeout = 30

    def do_GET(self):
        last[0] = time.monotonic()
        parts = self.path.split("/")
        path = files.get(parts[2]) if len(parts) == 3 and parts[1] == token else None
        try:
            f = open(path, "rb") if path else None
        except OSError:
            f = None
        if f is None:
            self.send_error(404)
            return
        with f:
            self.send_response(200)
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.end_headers()
            for chunk in iter(lambda: f.read(1 << 20), b""):
                self.wfile.write(chunk)
                last[0] = time.monotonic()

    def log_message(self, *args):
        pass

try:
    server = ThreadingHTTPServer((bind, 0), Files)
except OSError:
    server = ThreadingHTTPServer(("", 0), Files)
server.daemon_threads = True
print("port", server.server_address[1], flush=True)
started = time.monotonic()

def watch():
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        if now - last[0] > idle_s or now - started > max_s:
            server.shutdown()
            return

threading.Thread(target=watch, daemon=True).start()
server.serve_forever()
'''

RELAY_FETCH = r'''
import hashlib, os, stat, sys, time, urllib.request
url, base, timeout_s, deadline_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), \
    float(sys.argv[4])
os.umask(0o077)
ends = time.monotonic() + deadline_s
broken = ""

def digest_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def pull(digest, size, target):
    part = "%s.part-relay-%d" % (target, os.getpid())
    try:
        with urllib.request.urlopen("%s/%s" % (url, digest), timeout=timeout_s) as r, \
                open(part, "xb") as out:
            h, got = hashlib.sha256(), 0
            while True:
                if time.monotonic() > ends:
                    raise TimeoutError("deadline")
                chunk = r.read(min(1 << 20, size + 1 - got))
                if not chunk:
                    break
                got += len(chunk)
                if got > size:
                    raise ValueError("longer")
                h.update(chunk)
                out.write(chunk)
        if got != size:
            raise ValueError("shorter")
        if h.hexdigest() != digest:
            raise ValueError("digest")
        os.link(part, target)
        return os.stat(target).st_ino
    finally:
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass

for line in sys.stdin.read().splitlines():
    digest, size, rel = line.split(" ", 2)
    target = os.path.join(base, rel)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None:
        same = stat.S_ISREG(st.st_mode) and digest_of(target) == digest
        print("kept" if same else "refused", "-", rel, flush=True)
        continue
    if url == "-":
        print("missing", "-", rel, flush=True)
        continue
    if broken or time.monotonic() > ends:
        print("failed", broken or "deadline", rel, flush=True)
        continue
    try:
        print("created", pull(digest, int(size), target), rel, flush=True)
    except ValueError as exc:
        print("failed", str(exc) or "value", rel, flush=True)
    except Exception as exc:
        broken = type(exc).__name__
        print("failed", broken, rel, flush=True)
'''
