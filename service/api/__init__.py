"""HTTP API and web UI (FastAPI)."""
