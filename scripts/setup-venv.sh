#!/usr/bin/env bash
# Create .venv, install the pinned dependencies, then compile the router's request path with
# mypyc (setup.py, compiled-modules.txt). A stamp over everything that shapes the build
# (scripts/build_stamp.py) makes reruns free; editing a compiled module changes the stamp, so
# the next `make setup` or `make test` recompiles it.
# NARWHAL_PURE_PYTHON=1 skips the compile (a machine without a C compiler).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
py="${PYTHON:-python3}"
stamp=".venv/.narwhal-deps"
pure_flag=""
[ "${NARWHAL_PURE_PYTHON:-0}" = "1" ] && pure_flag="--pure"
want="$("$py" scripts/build_stamp.py $pure_flag)"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Dependencies first, uncompiled: mypyc type-checks the modules against them.
find src -name '*.so' -delete
NARWHAL_PURE_PYTHON=1 .venv/bin/python -m pip install -q -e '.[dev,workstation]'
if [ "${NARWHAL_PURE_PYTHON:-0}" != "1" ]; then
  echo "setup: compiling the router's request path (mypyc, about a minute)"
  .venv/bin/python -m pip install -q "setuptools==84.2.1" "wheel==0.48.0"
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
fi
echo "$want" > "$stamp"
echo "setup: .venv ready"
