"""Engine cache state in the router: what each engine holds (events or routing history)."""
