"""narwhal-profile's parts: what to measure (plan), measuring it (prompts, sweep), fitting the
cost curves (fit), writing the store and its samples (store_io), and showing it (progress, report).

The CLI in `narwhal.serve.profile_cli` only wires them together, so each part can be tested alone.
"""
