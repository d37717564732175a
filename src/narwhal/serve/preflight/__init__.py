"""Preflight (gate F): prove a live fleet can serve before the router takes traffic.

Gates run in cost order, each giving verdicts (pass / fail / skip with a reason) for an engine
or an ordered pair, with the value measured and the budget it was held to:

    reach -> model -> profile -> pace -> tokenize -> kv -> contract -> slo

A gate that needs an earlier gate's success for an engine skips that engine and says which
gate failed. Modules: verdicts.py (the record), options.py (budgets and their flags),
state.py (what the gates share), basic.py (reach, model,
tokenize), profile_gate.py (profile, slo), pace.py, kv_gate.py, contract.py, calibrate.py
(--calibrate-first-token), runner.py (order and dependencies), report.py (table, JSON,
evidence file). Probe prompts come from the profiler's prompts.py (nonce first, sized
on the engine's tokenizer). The command line is check_cli.py.
"""
