"""What both daemons' Prometheus endpoints share: the text exposition, the `/metrics` server with
its scrape guard, and the metric types (`families`). `prometheus_client` is imported only inside
this package; each daemon keeps its own collectors (`deviceplugin/metrics.py`,
`deviceplugin/monitor/vgpu.py`, `extender/metrics.py`).
"""
