"""`narwhal-engine`'s parts: the run plan, its checks against the host, the runtimes, the capture."""
