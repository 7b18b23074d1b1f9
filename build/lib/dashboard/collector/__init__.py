"""The collector: a FastAPI app that ranks report to and the dashboard reads from."""
