"""`hami certs`: the install job that creates and renews the CA, the certificates and the
booking key in Secrets (docs/install.md)."""
