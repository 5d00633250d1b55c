"""The DB command center web front end (see README.md)."""
