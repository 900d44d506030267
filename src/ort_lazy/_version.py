"""The version of ort-lazy (one place; packaging reads it)."""

__version__ = "0.1.0"
