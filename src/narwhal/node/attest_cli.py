"""`narwhal-attest`: Attestation sidecar: binds one live engine process and serves its attested contract (gate E)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built

DESCRIPTION = "Attestation sidecar: binds one live engine process and serves its attested contract (gate E)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal-attest", description=DESCRIPTION)
    parser.parse_args(argv)
    return not_built("narwhal-attest", DESCRIPTION)
