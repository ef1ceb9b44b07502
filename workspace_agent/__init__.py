"""The workspace agent program and the relay client: what runs inside a workspace
(or on a user's machine). Python's standard library only, on asyncio; the platform
hands it out as one zipapp file (app/workspace/routes/agent_files.py builds it):

    python3 workspace-agent.pyz agent --url https://workspace.example.org     # the agent
    python3 workspace-agent.pyz relay --url ... --agent <id> app <slug> <path>  # a relay client

From a checkout: `python3 -m workspace_agent ...`.
"""

from importlib import resources


def version():
    """The version of the platform that built this file ("unreleased" in a checkout)."""
    try:
        return resources.files(__name__).joinpath("VERSION").read_text().strip()
    except OSError:
        return "unreleased"
