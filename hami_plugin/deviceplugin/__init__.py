"""`hami device-plugin`: the node daemon, only what runs on a GPU node. NVML discovery
(`nvml.py`, over the NVML module it is handed: pynvml, or the fake in `hami_plugin.testing`),
the vGPU devices kubelet sees (`inventory.py`, `board.py`), health, kubelet registration and
restarts (`kubelet.py`), the register annotation (`register.py`); Allocate decided (`allocate.py`,
`pending.py`, `preferred.py`, pure) and served (`server.py`, `allocator.py`); HAMi's vGPU
monitor duties (`monitor/`) and the node's metrics.
"""
