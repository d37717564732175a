"""vLLM KV cache contract: geometry, NIXL compatibility hash, pair checks, fabric budget.

Pure: no I/O. Imports only narwhal.core. v0.29.0 is the reference release (`versions.py`).
"""
