"""Tools that run the bundle on a developer's machine and in tests: starting services
exactly as production does, and a local nginx in front of them. Not app code."""
