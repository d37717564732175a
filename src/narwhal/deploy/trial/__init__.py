"""The capacity trial (Gate G): an open-loop load client through the private path, the
router's journal reconciled with what was sent, and a verdict that says capacity only when
the miss was capacity."""
