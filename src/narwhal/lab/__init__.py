"""The rehearsal world: namespace hosts, tool doubles, the engine emulator, faults.

Never imported by product code (core, deploy, node, serve).
"""
