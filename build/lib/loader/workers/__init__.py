"""DataLoader worker processes: the watchdog, the main-guard check, stack dumps."""
