"""The runbook's gates, one module each, on one spine (spec.py, handoff.py, runner.py).

A gate declares what it reads (its `.env` inputs and the artifacts of earlier gates' passed
attempts) and how its work spreads over the fleet; it then plans from facts (recorded before
any host changes state) and executes through the host sessions, which record every command.
"""
