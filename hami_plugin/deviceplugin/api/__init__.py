"""Kubelet device-plugin API v1beta1 stubs, generated from proto/ (see proto/generate.py)."""
