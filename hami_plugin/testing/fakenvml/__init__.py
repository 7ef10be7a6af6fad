"""A fake NVML driven by a YAML file, so every daemon code path runs without a GPU
(`hami device-plugin --nvml fake --fake-gpus FILE`, the tests, the demo).

* `nvml`: `FakeNvml`, the module-like pynvml look-alike, and how it follows the file;
* `gpufile`: the fake GPU file's format, parsed and validated (`FakeGpuSpec`);
* `errors`: NVML's error classes and codes, as pynvml has them;
* `values`: what the calls return (handles, memory, utilisation, PCI info, events);
* `topology`: the GPU pairs' PCIe levels and NVLinks (the file's `topology`);
* `migtables`, `mignames`, `migstate`, `migcalls`, `migdevices`, `migvalues`: MIG: the modelled
  GPUs' profiles and placements, NVIDIA's profile names, the instances and NVML's rules for them
  (kept in `<file>.mig-state.json`), the pynvml MIG calls on instances and on MIG devices, and
  what they return.
"""
