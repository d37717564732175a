#!/usr/bin/env bash
# Create (once) the cached venv holding narwhal-inference 0.7.0, the router we compare against.
#
# It lives in its own venv because its import package is also called `narwhal` and would
# shadow ours. Prints the venv path on stdout's last line; `narwhal-serve` is in its bin/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=_venv-lib.sh
source "$here/_venv-lib.sh"
version="0.7.0"
build_cached_venv "narwhal-inference-${version}" \
  "import narwhal.cli, narwhal.serving.app" \
  "narwhal-inference==${version}"
