"""What the scheduler and the device plugin must agree on, and nothing else: the domain types,
the annotation codec, Kubernetes quantities, pods and nodes as both read them, the in-flight
rules, the node-lock rules, Go value parsing and Go-compatible JSON, the hook directory's layout
on the host. Pure: no I/O, no clocks, no logging.
"""
