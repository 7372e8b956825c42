"""Interop with other array libraries; each submodule is imported on first access."""

import importlib

__all__ = ["cupy"]


def __getattr__(name: str):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
