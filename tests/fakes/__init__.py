"""Pytest fixtures around the wire doubles of `hami_plugin.testing`."""
