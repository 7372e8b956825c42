"""Helpers of the CPU tests that drive the package's logic from several threads."""

from __future__ import annotations

import threading


def in_thread(fn):
    """Runs `fn` on a thread; returns (thread, outcome dict with 'result' or 'error')."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as e:  # handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome
