"""The HTTP API."""

from __future__ import annotations

from fastapi import FastAPI

from service import __version__


def create_app() -> FastAPI:
    app = FastAPI(title="facegate", version=__version__)

    @app.get("/healthz")
    def healthz() -> dict:
        """The process is alive (says nothing about models)."""
        return {"status": "ok"}

    return app
