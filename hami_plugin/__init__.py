"""hami-plugin: HAMi-compatible GPU sharing for Kubernetes."""
