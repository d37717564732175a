#!/usr/bin/env bash
# Create (once) the cached venv holding vllm-router 0.1.17 (Python launcher over a Rust core).
#
# Prints the venv path on stdout's last line; `vllm-router` is in its bin/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=_venv-lib.sh
source "$here/_venv-lib.sh"
version="0.1.17"
build_cached_venv "vllm-router-${version}" \
  "import vllm_router.launch_router" \
  "vllm-router==${version}"
