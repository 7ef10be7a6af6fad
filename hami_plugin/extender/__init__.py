"""`hami scheduler`: the kube-scheduler extender daemon (filter, bind, admission webhook).

The adapters around the pure scheduler core (`hami_plugin.scheduler`): the watches that feed
the ledger, the HTTP routes and wire format, the bookings and in-flight pods under one lock, the
bind steps against the API server, leader election, the recovery of stuck allocations and its
metrics.
"""
