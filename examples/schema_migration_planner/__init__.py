"""The schema-migration planner example (see README.md)."""
