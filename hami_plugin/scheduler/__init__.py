"""The scheduler's pure decisions: a pod's GPU requests, GPU and node scores, policies, the fit
of a pod on one node, the usage ledger, the filter's choice of node, node health (HAMi's
CheckHealth), the admission webhook's mutation and the dry run. No I/O: the scheduler daemon
(`hami_plugin.extender`) feeds them from its watches and serves them over HTTP.
"""
