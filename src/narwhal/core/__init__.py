"""Pure facts and arithmetic shared by every machine role: schemas, digests, KV geometry.

Nothing here performs I/O or imports another narwhal package.
"""
