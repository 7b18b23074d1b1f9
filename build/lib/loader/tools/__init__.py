"""The command line and what it prints: plan, inspect, rows (stdlib-light)."""
