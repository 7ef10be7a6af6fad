"""Test doubles that speak the real wire protocols, shipped with the package so that the tests,
the benchmarks and `make demo` run the daemons without a cluster or a GPU:

* `apiserver`: an HTTP double of the Kubernetes API server for the real `kubernetes` client;
* `kubelet`: a kubelet double serving the device-plugin Registration API on a unix socket;
* `admission`: the kubelet double's pod admission (which pods get Allocate, with which IDs);
* `hamicore`: the HAMi-core files the device plugin checks for under its hook path;
* `fakenvml`: a pynvml look-alike driven by a YAML file of fake GPUs, MIG included
  (`hami device-plugin --nvml fake --fake-gpus FILE`: the entry point hands it to the daemon).
"""
