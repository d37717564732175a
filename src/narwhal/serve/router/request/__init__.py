"""One request's path: its body, the prefill and decode legs, relays, pooled upstream
connections, the decision table, leg deadlines, the context check, the side legs
(/tokenize, KV release) and engine health.
"""
