"""Telemetry: the client, its exit handling, the reporter the loader calls, checkpoint events."""
