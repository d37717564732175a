"""Narwhal: deploy and run disaggregated vLLM inference fleets through a recorded, gated runbook."""

__version__ = "0.1.0"
