"""What the scheduler and the device plugin must agree on, and nothing else: the domain types,
the annotation codec, Kubernetes quantities, the in-flight rules, the node-lock rules, Go value
parsing and Go-compatible JSON. Pure: no I/O, no clocks, no logging.
"""
