"""The protocol the platform and its workspace agents share, written sans-IO: bytes
in, events and bytes out; no sockets, no threads, no event loop, standard library
only. `websocket` is RFC 6455 (the handshake's fields and the framing), `mux` the
multiplex protocol carried in its messages (streams, their windows, the message
types).

Three rooms, each importing only the one before it:

    workspace_protocol/   this package: shared, sans-IO
    workspace_agent/      the agent program and the relay client (asyncio, stdlib
                          only): runs inside a workspace, handed out by the platform
                          as one zipapp file
    app/workspace/        the platform (Flask on gunicorn's gevent worker)
"""
