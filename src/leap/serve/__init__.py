"""The HTTP service (FastAPI) and its client."""
