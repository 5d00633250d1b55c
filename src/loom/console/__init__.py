"""``loom console``: the web inspector, and the gate-decision helpers the CLI shares with it."""
