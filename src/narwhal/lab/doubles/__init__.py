"""Doubles of external tools, installed only inside lab hosts; stdlib only.

They run under the system Python from a host's PATH, so they must not import pydantic or
anything outside the standard library and this package.
"""
