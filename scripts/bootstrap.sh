#!/usr/bin/env bash
# Bring a fresh machine to the point where every test tier can run.
# Idempotent: packages already present are not reinstalled; the venv is reused when its
# build stamp matches pyproject.toml, setup.py and the compiled sources.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"

want=()
while read -r pkg; do
  pkg="${pkg%%#*}"; pkg="${pkg// /}"
  [ -n "$pkg" ] || continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || want+=("$pkg")
done < scripts/apt-packages.txt

if [ "${#want[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing ${want[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
  else
    echo "bootstrap: missing packages ${want[*]} (not root: tests that need them will skip with a reason)" >&2
  fi
fi

"$here/scripts/setup-venv.sh"
