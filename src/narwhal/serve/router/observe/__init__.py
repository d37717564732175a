"""What the router shows: Prometheus metrics and the per-request journal."""
