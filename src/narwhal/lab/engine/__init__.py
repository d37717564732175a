"""A vLLM-faithful engine emulator for the lab: same routes, metrics, logs and NIXL wire protocol.

Started like `vllm serve` (`python -m narwhal.lab.engine serve MODEL_DIR --port ...`), it lets
routers, the profiler and the preflight run against many engines on one CPU machine.
"""
