"""`python3 workspace-agent.pyz agent|relay ...` (see workspace_agent/__init__.py)."""

import sys

USAGE = "usage: workspace-agent {agent,relay} [options]  (--help after either says more)"


def main(argv):
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command == "agent":
        from workspace_agent import agent

        return agent.main(rest)
    if command == "relay":
        from workspace_agent import relay_client

        return relay_client.main(rest)
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
