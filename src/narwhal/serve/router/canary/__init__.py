"""The live KV canary: each ordered producer -> consumer pair probed with a fixed greedy
request while the router serves; a pair that answers wrong, recomputes or fails is held out
of placement (docs/router.md "The live KV canary")."""
