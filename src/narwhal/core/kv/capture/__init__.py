"""Pure parsers for what a live vLLM engine exposes: startup log, /metrics, /version, side channel.

Each raises ContractError naming the line or field it could not read, never returns a partial
answer silently: a capture that guesses would let a mismatched engine pass the gate.
"""
