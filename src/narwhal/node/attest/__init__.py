"""narwhal-attest's parts: the attestation document of one live engine, and its server."""
