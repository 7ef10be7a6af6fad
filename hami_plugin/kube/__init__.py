"""The Kubernetes API as the daemons use it: the client (the only importer of `kubernetes`), its
errors, the records it returns, watches and the informer.
"""
