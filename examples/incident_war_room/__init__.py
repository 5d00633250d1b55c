"""The incident war room example (see README.md)."""
