"""The DB command center as an HTTP service (see README.md)."""
