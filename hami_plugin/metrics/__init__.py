"""GPU and vGPU usage for Prometheus: the node's collectors (device plugin daemon), HAMi-core's
per-container shared regions, the priority feedback loop, and the scheduler's collectors.

`prometheus_client` is imported only inside this package.
"""
