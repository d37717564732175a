"""Placement: engines at run time and the load booked on them (bookings.py, its one
writer), the chooser seam (choosers.py), curve pricing (scheduler.py with costs.py,
projection.py, overflow.py and the admission table), role flips, the pool planner and
the profile (generation) binding.
"""
