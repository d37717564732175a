"""The gates built so far, by name: what `narwhal status` asks for each gate's fingerprint."""

from __future__ import annotations

from narwhal.deploy.gates import attest, discover, engines, fabric, install, preflight, serve
from narwhal.deploy.gates.spec import GateSpec

SPECS: dict[str, GateSpec] = {spec.name: spec for spec in (discover.SPEC, install.SPEC, engines.SPEC,
                                                     fabric.SPEC, attest.SPEC,
                                                     preflight.SPEC, serve.SPEC)}
