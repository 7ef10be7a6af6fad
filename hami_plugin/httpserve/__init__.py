"""The HTTP listeners both daemons run: one bounded HTTP/1.1 server (`server`: connection caps
overall and per client, header, handshake and idle timeouts, thread-start failures survived)
for the extender, the webhook, `/metrics` and the probes, and the probe routes with the
liveness of every listener (`probes`).
"""
