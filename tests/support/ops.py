"""What the ops tests share: the venv's tools, Jinja2 as Ansible renders templates,
TLS to a staging box by a site's name, and the recap line of an ansible run."""
import json
import re
import sys
from pathlib import Path

import jinja2
import requests

VENV_BIN = Path(sys.executable).parent


def venv_tool(name):
    path = VENV_BIN / name
    assert path.exists(), f"{name} is missing from the venv: it comes with requirements-dev.txt"
    return str(path)


def ansible_like(search_path):
    """Jinja2 as Ansible's template module has it, with the two filters the ops templates use."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(search_path)),
                                     undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     keep_trailing_newline=True)
    environment.filters["to_json"] = json.dumps
    return environment


class ServerName(requests.adapters.HTTPAdapter):
    """TLS to 127.0.0.1 with a site's name as SNI (the box's names resolve nowhere)."""

    def __init__(self, host):
        self.server_name = host
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, server_hostname=self.server_name, **kwargs)


def recap(output):
    match = re.search(r"^localhost\s+:\s+(.*)$", output, re.M)
    assert match, output[-3000:]
    return dict(item.split("=") for item in match.group(1).split())
