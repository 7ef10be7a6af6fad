"""Kubelet PodResources API v1 stubs, generated from proto/ (see proto/generate.py)."""
