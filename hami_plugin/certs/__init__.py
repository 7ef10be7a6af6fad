"""`hami certs`: the install job that creates and renews the CA, the certificates and the
booking key in Secrets (docs/install.md).

* `settings`: what the job is configured with, and what each certificate must say;
* `issue`: the CA and the leaves it signs, read back and judged (pure; the only importer of
  `cryptography`);
* `booking_key`: the booking key file (pure);
* `plan`: what to write, decided from what was read and the time (pure);
* `job`: the reads and writes, through `hami_plugin.kube`;
* `command`: the `hami certs` flags and exit status.
"""
