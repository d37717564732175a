"""Engine-host commands: inspection probes, engine launch and capture, the attestation sidecar."""
