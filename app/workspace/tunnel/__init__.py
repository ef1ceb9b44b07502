"""An agent's connection and what goes through it: the agents' registry and RPC
websocket, app streams, and one proxied request to a workspace app."""
