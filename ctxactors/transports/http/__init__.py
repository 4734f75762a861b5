"""The REST API: every tool over plain HTTP and JSON (Starlette, served by uvicorn)."""

from ctxactors.transports.http.app import build_openapi, create_app

__all__ = ["build_openapi", "create_app"]
