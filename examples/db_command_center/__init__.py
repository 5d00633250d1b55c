"""The DB command center example (see README.md)."""
