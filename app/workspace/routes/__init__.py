"""The platform's route modules, each with its blueprint: the API, pages, workspaces,
agent files, relay, terminal and the apps proxy's routes. The top layer."""
