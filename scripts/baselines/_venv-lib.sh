#!/usr/bin/env bash
# Shared by setup-narwhal-inference.sh and setup-vllm-router.sh: build one pinned venv once.
#
# usage: source _venv-lib.sh; build_cached_venv NAME IMPORT_CHECK PIP_ARGS...
# The venv is built in a scratch folder under the cache and renamed into place only when the
# install and the import check passed, so an interrupted install never leaves a venv that looks
# ready. A venv writes its own path into its console scripts' first line, so those lines are
# pointed at the final path before the rename. Prints the venv path on stdout's last line; all
# pip output goes to stderr.
set -euo pipefail

build_cached_venv() {
  local name="$1" check="$2"
  shift 2
  local py="${PYTHON:-python3}"
  local cache="${NARWHAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/narwhal}"
  local venv="$cache/$name"
  # Our own `narwhal` package must never leak into the build or the import check.
  unset PYTHONPATH PYTHONHOME
  if [ -x "$venv/bin/python" ] && [ -f "$venv/.narwhal-ready" ]; then
    echo "$venv"
    return 0
  fi
  mkdir -p "$cache"
  local scratch
  scratch="$(mktemp -d "$cache/.building-XXXXXX")"
  # shellcheck disable=SC2064  # expand now: the trap must remove this scratch folder
  trap "rm -rf '$scratch'" EXIT
  local start end
  start="$(date +%s)"
  echo "baselines: installing $* into $venv (cold install)" >&2
  "$py" -m venv "$scratch/venv"
  "$scratch/venv/bin/python" -m pip -q --disable-pip-version-check install "$@" >&2
  "$scratch/venv/bin/python" -I -c "$check" >&2
  end="$(date +%s)"
  echo "cold install took $((end - start)) s" > "$scratch/venv/.narwhal-install-time"
  # Point the console scripts (and activate) at the final path before publishing the venv.
  local f
  for f in "$scratch/venv"/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    if head -c 2 "$f" | grep -q '^#!'; then
      sed -i "1s|$scratch/venv|$venv|" "$f"
    fi
  done
  sed -i "s|$scratch/venv|$venv|g" "$scratch/venv/bin/activate" "$scratch/venv/pyvenv.cfg"
  touch "$scratch/venv/.narwhal-ready"
  if [ -f "$venv/.narwhal-ready" ]; then  # another run published it meanwhile: keep theirs
    echo "$venv"
    return 0
  fi
  rm -rf "$venv"
  # -T: never nest our venv inside one that appeared in between; fail instead.
  mv -T "$scratch/venv" "$venv"
  echo "baselines: cold install took $((end - start)) s" >&2
  echo "$venv"
}
