#!/usr/bin/env bash
# Create .venv and install the pinned dependencies; a stamp makes reruns free.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
py="${PYTHON:-python3}"
stamp=".venv/.narwhal-deps"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
echo "$want" > "$stamp"
echo "setup: .venv ready"
