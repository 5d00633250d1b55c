"""The ``loom`` command line."""

from loom.cli._app import app, main

__all__ = ["app", "main"]
