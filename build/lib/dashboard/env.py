"""The environment variables the dashboard's two processes read, named once.

Standard library only (nothing at all): the Streamlit process (`client.py`) and the
collector (`collector/config.py`) both import these names, so the Streamlit process never
imports the collector, its store or its models for a variable's name.
"""

from __future__ import annotations

# The Streamlit process: where the collector is, and the token it requires.
ENV_API = "ELASTIC_LOADER_DASHBOARD_API"
ENV_TOKEN = "ELASTIC_LOADER_DASHBOARD_TOKEN"
# The collector (`Settings.from_env`); `launch.py` passes them to a collector subprocess.
ENV_DB = "ELASTIC_LOADER_DASHBOARD_DB"
ENV_HOST = "ELASTIC_LOADER_DASHBOARD_HOST"
ENV_ALLOWED_HOSTS = "ELASTIC_LOADER_DASHBOARD_ALLOWED_HOSTS"
ENV_KEEP_RUNS = "ELASTIC_LOADER_DASHBOARD_KEEP_RUNS"
ENV_KEEP_DAYS = "ELASTIC_LOADER_DASHBOARD_KEEP_DAYS"
ENV_STALL_AFTER_S = "ELASTIC_LOADER_DASHBOARD_STALL_AFTER_S"
