"""The management workstation: inputs, the ledger, host sessions and the gates A..G."""
