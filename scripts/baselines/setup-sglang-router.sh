#!/usr/bin/env bash
# Create (once) the cached venv holding sglang-router 0.3.2 (Python launcher over a Rust core),
# the SGLang project's cache-aware router, for bench/prefix.py.
#
# Prints the venv path on stdout's last line; `python -m sglang_router.launch_router` runs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=_venv-lib.sh
source "$here/_venv-lib.sh"
version="0.3.2"
build_cached_venv "sglang-router-${version}" \
  "import sglang_router.launch_router" \
  "sglang-router==${version}"
