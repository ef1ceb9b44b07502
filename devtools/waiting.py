"""Waiting for a condition, never for a guessed number of seconds: the tests, the
benches and devtools' scripts poll with a deadline through this one helper."""

import time


def wait_for(predicate, what="the condition", timeout=60.0):
    """Poll `predicate` every 0.1 s until it returns a true value, and return that
    value; past `timeout` seconds, TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.1)  # polling a condition with a deadline
