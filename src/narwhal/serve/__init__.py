"""Router-host commands: the router, profiler, preflight checks and observability."""
