"""The notebook site's tight rate limit (a POST that runs a model or adds a source) covers
every route that adds a source: /sources/json escaped it once (issue #32)."""

import re

from devtools import nginx as nginx_tool

SOURCE_ROUTES = ("/sources", "/sources/json", "/sources/abc/retry", "/sources/abc/insights")


def _heavy_locations(prefix):
    variables = nginx_tool.variables_for(8080, {"notebook": "127.0.0.1:9"})
    nginx_tool.render(prefix, variables)
    site = (prefix / "sites" / "notebook.conf").read_text()
    return [
        re.compile(match.group(1))
        for match in re.finditer(r"location ~ (\S+) \{([^}]*)\}", site)
        if "zone=notebook_heavy" in match.group(2)
    ]


def test_every_source_adding_route_is_in_the_tight_zone(tmp_path):
    heavy = _heavy_locations(tmp_path)
    for route in SOURCE_ROUTES:
        for prefix in ("", "/api"):
            assert any(h.match(prefix + route) for h in heavy), f"{prefix}{route} escapes the write limit"
    assert not any(h.match("/sources/abc") for h in heavy)  # reading a source is not heavy
