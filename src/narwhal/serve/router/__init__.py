"""narwhal-serve, the prefill/decode router (gate G): one process, by part.

app.py wires the parts and runs the lifecycle; settings.py settles the fleet document
into frozen values; calibrated_deadline.py is the startup check against the first-token
calibration; jsonio.py is JSON for every part. front/ is the client-facing HTTP server,
request/ one request's two legs, scheduling/ where legs are placed and priced, control/
who may serve (lease, leadership, attestation), observe/ metrics and the journal.
Nothing here imports anything of serve/ outside router/: not the profiler, preflight,
engine_client.py nor the command lines (tests/unit/test_architecture.py).
"""
