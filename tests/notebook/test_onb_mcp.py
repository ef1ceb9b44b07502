"""onb-mcp (the MCP server on PyPI that wraps Open Notebook's `/api`, a development
dependency) against ours: started over stdio by the MCP Python client
(`mcp.ClientSession`), with OPEN_NOTEBOOK_URL at our notebook on gunicorn and our
password as OPEN_NOTEBOOK_PASSWORD, every tool within our spec's scope called with
real arguments and its result's content checked. onb-mcp turns a failed API call
into an error result whose text is "API request failed: <detail>": `McpTools.call`
raises on it, so a tool that fails names itself and our answer.

Its tools are read from its source (`onb_mcp/tools/*.py`): the paths each calls and
the arguments it sends are Open Notebook's, with its own quirks that ours must take
as they are: `create_source` has no `content` (so it adds links; the text sources
the searches need are added through our API), `create_transformation` sends no
`title`, `register_models` posts no body, `apply_transformation` reads an
`insights` key of the answer (its effect is checked through our API), `ask_question`
reads the SSE stream of `/api/search/ask` as a non-JSON body (its text comes back
as `content`), and `rebuild_embeddings` posts to `/api/rebuild`, which Open
Notebook itself lacks.

Podcasts: our profiles are built in and read-only (one episode profile per length,
one speaker profile per number of speakers: docs/decisions/notebook.md), so the
profile tools that read work and those that write (create, update, delete) fail with
our 405 saying so; the test checks both.
onb-mcp has no tool for the commands, for setting the default models, for
creating a credential or for the notebook-source links: those are made through
our API where a step needs them."""

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.notebook import PASSWORD, add_text_source, credential
from tests.support.open_notebook_ui import default_models, fake_openai_models

ONB_MCP = str(Path(sys.executable).parent / "onb-mcp")
IN_SCOPE = {
    "search_capabilities",
    "list_notebooks",
    "get_notebook",
    "create_notebook",
    "update_notebook",
    "delete_notebook",
    "list_sources",
    "get_source",
    "create_source",
    "update_source",
    "delete_source",
    "list_notes",
    "get_note",
    "create_note",
    "update_note",
    "delete_note",
    "search",
    "ask_question",
    "ask_simple",
    "list_models",
    "get_model",
    "create_model",
    "delete_model",
    "get_default_models",
    "list_chat_sessions",
    "create_chat_session",
    "get_chat_session",
    "update_chat_session",
    "delete_chat_session",
    "execute_chat",
    "get_chat_context",
    "get_settings",
    "update_settings",
    "list_credentials",
    "test_credential",
    "discover_models",
    "register_models",
    "list_transformations",
    "create_transformation",
    "apply_transformation",
    "rebuild_embeddings",
    "list_speaker_profiles",
    "get_speaker_profile",
    "list_episode_profiles",
    "get_episode_profile",
    "generate_podcast",
    "retry_podcast",
    "get_podcast_job_status",
}
# Refused with a 405 that says why: the profiles are built in.
READ_ONLY = {
    *(f"{verb}_speaker_profile" for verb in ("create", "update", "delete")),
    *(f"{verb}_episode_profile" for verb in ("create", "update", "delete")),
}
DEADLINE = 60.0
T = TypeVar("T")


class ToolFailed(AssertionError):
    """A tool's error result (onb-mcp raises on a non-2xx answer; FastMCP sends the text)."""


class McpTools:
    """The client side of one onb-mcp session: a tool's result as the dict it returned."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        result = await self.session.call_tool(tool, arguments)
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.isError or text.startswith("Error executing tool") or "API request failed" in text:
            raise ToolFailed(f"{tool}({arguments}) -> {text[:2000]}")
        return json.loads(text)

    async def fails(self, tool: str, /, **arguments: Any) -> str:
        """The error text of a call that must fail (a deleted record, say)."""
        try:
            answer = await self.call(tool, **arguments)
        except ToolFailed as failed:
            return str(failed)
        raise AssertionError(f"{tool} should have failed, answered {answer}")


def with_onb_mcp(nb, scenario: Callable[[McpTools], Awaitable[T]]) -> T:
    """Start onb-mcp over stdio against `nb`, run `scenario` in its session, stop it;
    what the scenario returns (waits for the worker's jobs come after, off the loop)."""
    server = StdioServerParameters(
        command=ONB_MCP,
        args=[],
        env={"OPEN_NOTEBOOK_URL": nb.url, "OPEN_NOTEBOOK_PASSWORD": PASSWORD, "MCP_TRANSPORT": "stdio"},
    )

    async def run() -> T:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await scenario(McpTools(session))

    # In a thread of its own: Playwright's sync API (tests/browser, earlier in the same
    # session) leaves an event loop running in the main thread, where asyncio.run refuses.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, run()).result()


@pytest.fixture(scope="module")
def mcp_models(llm_nb) -> dict[str, str]:
    return fake_openai_models(llm_nb)


@pytest.fixture
def defaults(llm_nb, mcp_models) -> Iterator[dict[str, str]]:
    """The fake's models as the defaults for the test, the defaults before set back after it."""
    with default_models(llm_nb, mcp_models) as chosen:
        yield chosen


def unique(name: str) -> str:
    return f"{name} {uuid.uuid4().hex[:8]}"


def wait_until(condition: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + DEADLINE
    while not (value := condition()):
        assert time.monotonic() < end, f"no {what} after {DEADLINE} s"
        time.sleep(0.2)  # a job of the worker: wait for its effect, with a deadline
    return value


# --------------------------------------------------------------------------- the tools


def test_its_tools_are_listed_and_described(llm_nb):
    async def scenario(tools: McpTools) -> None:
        listed = {tool.name: tool for tool in (await tools.session.list_tools()).tools}
        assert set(listed) == IN_SCOPE | READ_ONLY  # a new onb-mcp tool shows up here
        assert "notebook_id" in listed["create_source"].inputSchema["properties"]
        found = await tools.call("search_capabilities", query="notebook create", detail="full", limit=5)
        create = next(match for match in found["matches"] if match["name"] == "create_notebook")
        assert create["args"] == {"name": "str", "description": "Optional[str]"}

    with_onb_mcp(llm_nb, scenario)


def test_notebooks(llm_nb):
    async def scenario(tools: McpTools) -> None:
        name = unique("MCP notebook")
        created = (await tools.call("create_notebook", name=name, description="made over MCP"))["notebook"]
        assert created["name"] == name and created["description"] == "made over MCP"
        twin = (await tools.call("create_notebook", name=name))["notebook"]  # the same name again
        assert twin["id"] != created["id"]
        listed = await tools.call("list_notebooks", archived=False, order_by="created desc", limit=100)
        assert {created["id"], twin["id"]} <= {n["id"] for n in listed["notebooks"]}
        assert listed["count"] == len(listed["notebooks"])
        got = (await tools.call("get_notebook", notebook_id=created["id"]))["notebook"]
        assert got["name"] == name and got["archived"] is False
        updated = await tools.call("update_notebook", notebook_id=created["id"], name=name + " 2", archived=True)
        assert updated["notebook"]["name"] == name + " 2" and updated["notebook"]["archived"] is True
        archived = await tools.call("list_notebooks", archived=True, limit=100)
        assert created["id"] in [n["id"] for n in archived["notebooks"]]
        await tools.call("delete_notebook", notebook_id=twin["id"])
        assert "not found" in (await tools.fails("get_notebook", notebook_id=twin["id"])).lower()

    with_onb_mcp(llm_nb, scenario)


def test_sources_and_notes(llm_nb, link_server, defaults):
    notebook_id = llm_nb.notebook(unique("MCP sources"))

    async def scenario(tools: McpTools) -> None:
        url = link_server.base_url + "/article.html"
        source = (
            await tools.call("create_source", notebook_id=notebook_id, type="link", url=url, title="Reefs", embed=True)
        )["source"]
        assert source["title"] == "Reefs"
        listed = await tools.call("list_sources", notebook_id=notebook_id, limit=20, offset=0)
        assert listed["count"] == 1 and listed["sources"][0]["id"] == source["id"]
        got = (await tools.call("get_source", source_id=source["id"]))["source"]
        assert "polyps" in got["full_text"] and notebook_id in got["notebooks"]
        renamed = await tools.call("update_source", source_id=source["id"], title="Coral reefs", topics=["reefs"])
        assert renamed["source"]["title"] == "Coral reefs"

        note = (
            await tools.call(
                "create_note", notebook_id=notebook_id, title="Bleaching", content="Warm water.", topics=["coral"]
            )
        )["note"]
        assert note["title"] == "Bleaching" and note["content"] == "Warm water."
        notes = await tools.call("list_notes", notebook_id=notebook_id)
        assert notes["count"] == 1 and notes["notes"][0]["id"] == note["id"]
        assert (await tools.call("get_note", note_id=note["id"]))["note"]["content"] == "Warm water."
        edited = await tools.call("update_note", note_id=note["id"], content="Warm water bleaches coral.", topics=[])
        assert edited["note"]["content"] == "Warm water bleaches coral." and edited["note"]["title"] == "Bleaching"
        await tools.call("delete_note", note_id=note["id"])
        assert "not found" in (await tools.fails("get_note", note_id=note["id"])).lower()
        await tools.call("delete_source", source_id=source["id"])
        assert "not found" in (await tools.fails("get_source", source_id=source["id"])).lower()

    with_onb_mcp(llm_nb, scenario)


def test_search_and_ask(llm_nb, defaults):
    notebook_id = llm_nb.notebook(unique("MCP search"))
    added = llm_nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook_id,
            "content": "Volcanoes erupt molten lava and ash.",
            "embed": True,
        },
    )
    assert added.status_code == 201 and added.json()["embedded"] is True, added.text
    volcano = added.json()["id"]
    chat = defaults["chat"]

    async def scenario(tools: McpTools) -> None:
        for kind, query in (("text", "molten lava"), ("vector", "lava and ash")):
            found = (await tools.call("search", query=query, type=kind, notebook_id=notebook_id, limit=10))["results"]
            assert found["search_type"] == kind and volcano in [hit["parent_id"] for hit in found["results"]], found
        models = {"strategy_model": chat, "answer_model": chat, "final_answer_model": chat}
        simple = (
            await tools.call("ask_simple", question="What do volcanoes erupt?", notebook_id=notebook_id, **models)
        )["result"]
        assert simple["question"] == "What do volcanoes erupt?" and simple["answer"]
        streamed = (
            await tools.call("ask_question", question="What do volcanoes erupt?", notebook_id=notebook_id, **models)
        )["result"]
        # Not JSON: onb-mcp hands the stream's text back as `content`.
        records = [json.loads(line[6:]) for line in streamed["content"].splitlines() if line.startswith("data: ")]
        assert [r["type"] for r in records][-2:] == ["final_answer", "complete"], records
        assert records[-1]["final_answer"]

    with_onb_mcp(llm_nb, scenario)


def test_models_and_defaults(llm_nb, defaults):
    async def scenario(tools: McpTools) -> None:
        listed = await tools.call("list_models", limit=100)
        assert {defaults["chat"], defaults["embedding"]} <= {m["id"] for m in listed["models"]}
        got = (await tools.call("get_model", model_id=defaults["chat"]))["model"]
        assert (got["name"], got["provider"], got["type"]) == ("fake-chat", "openai", "language")
        made = (await tools.call("create_model", name=unique("fake-chat"), provider="openai", type="language"))["model"]
        assert made["type"] == "language" and made["provider"] == "openai"
        await tools.call("delete_model", model_id=made["id"])
        assert "not found" in (await tools.fails("get_model", model_id=made["id"])).lower()
        chosen = (await tools.call("get_default_models"))["defaults"]
        assert chosen["default_chat_model"] == defaults["chat"]
        assert chosen["default_embedding_model"] == defaults["embedding"]

    with_onb_mcp(llm_nb, scenario)


def test_chat(llm_nb, defaults):
    notebook_id = llm_nb.notebook(unique("MCP chat"))
    kept = add_text_source(llm_nb, notebook_id, "Glaciers", "Glaciers carve U-shaped valleys.")
    left_out = add_text_source(llm_nb, notebook_id, "Secret", "The vault's password is saffron.")

    async def scenario(tools: McpTools) -> None:
        session = (await tools.call("create_chat_session", notebook_id=notebook_id, title="Valleys"))["session"]
        assert session["title"] == "Valleys"
        listed = await tools.call("list_chat_sessions", notebook_id=notebook_id)
        assert listed["count"] == 1 and listed["sessions"][0]["id"] == session["id"]
        everything = (await tools.call("get_chat_context", notebook_id=notebook_id))["context"]
        assert "saffron" in str(everything["context"]) and "U-shaped" in str(everything["context"])
        config = {"sources": {kept: "full content", left_out: "not in"}, "notes": {}}
        built = (await tools.call("get_chat_context", notebook_id=notebook_id, context_config=config))["context"]
        assert "saffron" not in str(built["context"]) and built["token_count"] > 0
        llm_nb.fake.reset()
        answer = await tools.call(
            "execute_chat", session_id=session["id"], message="What shapes are valleys?", context=built["context"]
        )
        assert answer["response"]["messages"][-1]["type"] == "ai" and answer["response"]["messages"][-1]["content"]
        assert "saffron" not in str([seen["body"] for seen in llm_nb.fake.seen])
        got = (await tools.call("get_chat_session", session_id=session["id"]))["session"]
        assert [m["type"] for m in got["messages"]] == ["human", "ai"]
        renamed = await tools.call("update_chat_session", session_id=session["id"], title="Glacial valleys")
        assert renamed["session"]["title"] == "Glacial valleys"
        await tools.call("delete_chat_session", session_id=session["id"])
        assert "not found" in (await tools.fails("get_chat_session", session_id=session["id"])).lower()

    with_onb_mcp(llm_nb, scenario)


def test_settings(llm_nb):
    async def scenario(tools: McpTools) -> None:
        before = (await tools.call("get_settings"))["settings"]["default_embedding_option"]
        try:
            saved = await tools.call("update_settings", settings={"default_embedding_option": "never"})
            assert saved["settings"]["default_embedding_option"] == "never"
            assert (await tools.call("get_settings"))["settings"]["default_embedding_option"] == "never"
        finally:
            await tools.call("update_settings", settings={"default_embedding_option": before})

    with_onb_mcp(llm_nb, scenario)


def test_credentials(llm_nb):
    made = credential(llm_nb, "openai", key="sk-good", name=unique("MCP key"))  # onb-mcp has no tool for it

    async def scenario(tools: McpTools) -> None:
        listed = (await tools.call("list_credentials", provider="openai"))["credentials"]
        assert made["id"] in [c["id"] for c in listed] and all(c["provider"] == "openai" for c in listed)
        tested = (await tools.call("test_credential", credential_id=made["id"]))["result"]
        assert tested["success"] is True and tested["provider"] == "openai"
        discovered = (await tools.call("discover_models", credential_id=made["id"]))["discovered_models"]
        names = {m["name"] for m in discovered["discovered"]}
        assert {"fake-chat", "fake-embed", "fake-tts"} <= names
        # No body: every discovered model is registered, linked to the credential.
        registered = (await tools.call("register_models", credential_id=made["id"]))["result"]
        assert registered["created"] + registered["existing"] == len(names)
        linked = [m for m in (await tools.call("list_models", limit=100))["models"] if m["credential"] == made["id"]]
        assert {m["name"] for m in linked} == names

    with_onb_mcp(llm_nb, scenario)
    assert llm_nb.delete(f"/credentials/{made['id']}", params={"delete_models": "true"}).status_code == 200


def test_transformations_and_insights(llm_nb, defaults):
    notebook_id = llm_nb.notebook(unique("MCP insights"))
    source_id = add_text_source(llm_nb, notebook_id, "Tea", "Green tea is steamed; black tea is oxidised.")

    async def scenario(tools: McpTools) -> str:
        name = unique("key points")
        made = (await tools.call("create_transformation", name=name, prompt="List the key points.", description="x"))[
            "transformation"
        ]
        assert made["name"] == name and made["prompt"] == "List the key points."
        listed = (await tools.call("list_transformations"))["transformations"]
        assert made["id"] in [t["id"] for t in listed]
        await tools.call("apply_transformation", source_id=source_id, transformation_id=made["id"])
        return made["id"]

    transformation_id = with_onb_mcp(llm_nb, scenario)
    insights = wait_until(lambda: llm_nb.get(f"/sources/{source_id}/insights").json(), "insight")
    assert insights[0]["content"] and transformation_id in str(insights[0])


def test_rebuild_embeddings(llm_nb, defaults):
    notebook_id = llm_nb.notebook(unique("MCP rebuild"))
    source_id = add_text_source(llm_nb, notebook_id, "Moss", "Moss grows on the north side of trees.")
    assert llm_nb.get(f"/sources/{source_id}").json()["embedded"] is False

    async def scenario(tools: McpTools) -> dict[str, Any]:
        return (await tools.call("rebuild_embeddings", notebook_id=notebook_id))["job"]

    job = with_onb_mcp(llm_nb, scenario)
    command = llm_nb.wait_command(job["command_id"])
    assert command["status"] == "completed", command
    assert llm_nb.get(f"/sources/{source_id}").json()["embedded"] is True


def test_podcasts_from_the_built_in_profiles(llm_nb, defaults):
    notebook_id = llm_nb.notebook(unique("MCP podcast"))
    add_text_source(llm_nb, notebook_id, "Owls", "Owls hunt at night and fly silently.")

    async def scenario(tools: McpTools) -> dict[str, Any]:
        episode_profiles = (await tools.call("list_episode_profiles"))["episode_profiles"]
        speaker_profiles = (await tools.call("list_speaker_profiles"))["speaker_profiles"]
        assert [p["name"] for p in episode_profiles] == ["short", "medium", "long"]
        two = (await tools.call("get_speaker_profile", profile_id="speaker_profile:2"))["speaker_profile"]
        assert two in speaker_profiles and [s["name"] for s in two["speakers"]] == ["Alex", "Sam"]
        short = (await tools.call("get_episode_profile", profile_id="short"))["episode_profile"]
        assert short["speaker_config"] == two["id"]
        refused = await tools.fails("create_episode_profile", name="mine", speaker_config=two["id"])
        assert "read-only" in refused
        assert "read-only" in await tools.fails("delete_speaker_profile", profile_id=two["id"])
        queued = (
            await tools.call(
                "generate_podcast",
                notebook_id=notebook_id,
                episode_name="Night hunters",
                episode_profile="short",
                speaker_profile=two["name"],
                briefing_suffix="Mention silence.",
            )
        )["command"]
        assert queued["episode_name"] == "Night hunters"
        return queued

    queued = with_onb_mcp(llm_nb, scenario)
    assert llm_nb.wait_command(queued["job_id"])["status"] == "completed"

    async def afterwards(tools: McpTools) -> None:
        status = (await tools.call("get_podcast_job_status", job_id=queued["job_id"]))["status"]
        assert status["status"] == "completed" and status["job_id"] == queued["job_id"]
        assert "completed" in await tools.fails("retry_podcast", episode_id=queued["episode_id"])

    with_onb_mcp(llm_nb, afterwards)
    episode = llm_nb.get(f"/podcasts/episodes/{queued['episode_id']}").json()
    assert episode["speakers"] == 2 and episode["length"] == "short" and episode["briefing"] == "Mention silence."
