"""HAMi's vGPU monitor duties, run by the device plugin daemon: HAMi-core's per-container
regions read (usage), stale container directories removed, the priority feedback loop.
"""
