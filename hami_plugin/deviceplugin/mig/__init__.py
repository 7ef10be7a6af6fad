"""MIG on the node: the devices NVML reports (`devices`), the NVML calls that list, create and
destroy them (`nvml`), the static strategies that advertise pre-made MIG devices to kubelet
(`static`), and the dynamic MIG manager that realises the scheduler's MIG reservations
(`manager`, `startup`)."""
