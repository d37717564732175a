"""Gate D's parts: the budget per directed edge, link fingerprints, the samples (iperf3 and
perftest) and what they say, the diagnosis of a failing edge, the edge matrix and its picture."""
