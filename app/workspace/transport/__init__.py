"""The wire: the multiplex protocol's driver, websockets, and the mesh between
workers. Imports nothing of the platform above it."""
