"""`hami scheduler`: the kube-scheduler extender daemon (filter, bind, admission webhook).

The adapters around the pure scheduler core (`hami_plugin.scheduler`): the watches that feed
the ledger, the HTTP routes, the bind steps against the API server, leader election and the
recovery of stuck allocations.
"""
