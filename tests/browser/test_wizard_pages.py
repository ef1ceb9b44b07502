"""The prompt wizard's pages in headless Chromium, through the real nginx site.

Identity is what nginx says: without an identity provider every visitor is `public`;
with the Authelia-shaped test provider, its session cookie (which production sets on
the parent domain) makes the browser a signed-in user. Generation goes to the local
OpenAI-compatible fake, whose models are chosen by name.
"""

import io
import json
import re

import pytest
import requests
from PIL import Image
from playwright.sync_api import expect

from devtools.fake_providers import FakeProviders
from devtools.oidc_provider import SESSION_COOKIE, portal_session
from tests.support.browser import ARTIFACTS
from tests.support.wizard import FORWARD_AUTH_PASSWORD

KEY = "sk-test-wizard-pages-0123456789"
SEVEN = ["wizards", "blueprints", "prompt_history", "saved_prompts", "likes", "admin_prompts", "llm_logs"]
LIVE_WITHIN_MS = 2000  # check 10: a change in one tab shows in another within 2 s
CANONICAL_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def fake_ai():
    with FakeProviders(host="127.0.0.1", keys={"openai": KEY}) as fake:
        yield fake


@pytest.fixture(autouse=True)
def no_uncaught_page_errors(site, context, request):
    """Every page of the test's context runs without an uncaught exception (the test of
    error reporting raises its own on purpose). `site` comes first so that the services
    stop after the context's screenshots, not before."""
    errors = []
    context.on("weberror", lambda error: errors.append(str(error.error)))
    yield errors
    if request.node.name != "test_client_errors_are_reported_to_the_service":
        assert not errors, f"uncaught errors in the pages: {errors}"


def screenshot(page, name):
    """An extra screenshot beside the fixture's final one."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def ai_env(fake):
    return {
        "WIZ_AI_BASE_URL": fake.base_url(),
        "WIZ_AI_API_KEY": KEY,
        "WIZ_TEXT_MODEL": "fake-ideas-5",
        "WIZ_IMAGE_MODEL": "fake-webp",
        "WIZ_AI_PROVIDER": "fake-openai",
    }


def wizard_site(site, tmp_path, env=None, provider=None):
    """The wizard behind nginx, which serves the uploads folder itself as in production."""
    data_dir = tmp_path / "wizard-data"
    variables = {"wizard_uploads_dir": str(data_dir / "uploads"), "wizard_lists_dir": str(data_dir / "lists")}
    if provider is not None:
        variables["wizard_auth_request_url"] = provider.issuer + "/api/authz/auth-request"
    return site("wizard", env=env, variables=variables, data_dir=data_dir)


def sign_in(context, wizard, provider, username):
    """The provider's session cookie after a portal sign-in, given to the browser for
    the wizard's host (what Authelia's parent-domain cookie does in production)."""
    value = portal_session(provider.issuer, username, FORWARD_AUTH_PASSWORD)
    context.add_cookies([{"name": SESSION_COOKIE, "value": value, "domain": wizard.host, "path": "/"}])


def http(wizard, method, path, **kwargs):
    """A request through the site's nginx from outside the browser (the host name
    *.localhost resolves in Chromium only, so the Host header names the site)."""
    return requests.request(
        method, wizard.proxy.url + path, headers=wizard.proxy.headers("wizard"), timeout=10, **kwargs
    )


def open_page(page, url):
    """Go to a page and wait until its live event stream is open, so that every change
    made after this is announced to it."""
    page.bring_to_front()
    page.goto(url)
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    return page


def act_in(page):
    """Bring a tab to the front before acting in it: Chromium throttles the animation
    frames of a background tab, which Playwright's actions wait on."""
    page.bring_to_front()
    return page


def png_bytes(size=(48, 36)):
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 90, 40)).save(buffer, "PNG")
    return buffer.getvalue()


def create_blueprint(page, title, cover=None):
    page.get_by_label("Title").fill(title)
    if cover is not None:
        page.get_by_label("Cover image").set_input_files(cover)
    page.get_by_role("button", name="Create blueprint").click()


def like_button(page, title):
    return page.locator(".blueprint", has=page.get_by_role("heading", name=title)).locator("button.like")


# ---- Home: building, saving, generating -------------------------------------------------


def test_build_a_prompt_from_a_seed_wizard_and_save_it(site, page, tmp_path):
    wizard = wizard_site(site, tmp_path)  # no AI provider configured
    open_page(page, wizard.url + "/")
    page.get_by_role("button", name="Start the wizard Product description").click()
    expect(page.locator("#step-count")).to_have_text("· step 1 of 3")
    page.get_by_label("What is the product?").fill("a cast-iron kettle")
    page.keyboard.press("Control+Enter")  # keyboard use: the next step
    page.get_by_label("Who buys it?").fill("people who camp")
    page.get_by_role("button", name="Next").click()
    page.get_by_label("warm").check()
    page.get_by_role("button", name="Build prompt").click()
    expected = (
        "Write a product description of a cast-iron kettle for people who camp, in a warm tone, in at most 120 words."
    )
    expect(page.get_by_label("Prompt (edit it as you like)")).to_have_value(expected)
    expect(page.locator("#save-status")).to_have_text("Prompt built and added to your history.")
    page.get_by_role("button", name="Save to library").click()
    expect(page.locator("#save-status")).to_contain_text("Saved to your library")

    # Without a provider the page says generation is unavailable, and shows nothing made up.
    page.get_by_role("button", name="Generate ideas").click()
    expect(page.locator("#generate-status")).to_contain_text("Idea generation is unavailable on this server")
    expect(page.locator("#ideas-box")).to_be_hidden()
    expect(page.get_by_role("button", name="Generate ideas")).to_be_disabled()

    page.get_by_role("link", name="Library").click()
    expect(page.locator("#saved .prompt")).to_have_text([expected])
    expect(page.locator("#history .prompt")).to_have_text([expected])
    expect(page.locator(".notice")).to_contain_text("shared public library")


def test_generate_ideas_with_live_thoughts_and_an_image(site, page, tmp_path, fake_ai):
    wizard = wizard_site(site, tmp_path, env=ai_env(fake_ai))
    open_page(page, wizard.url + "/")
    page.locator("#prompt-text").fill("A name for a bakery that only opens at night")
    with page.expect_request(re.compile(r"/api/ai/thoughts/[0-9a-f]{32}$")):
        page.get_by_role("button", name="Generate ideas").click()
    expect(page.locator("#ideas .idea")).to_have_count(5)
    expect(page.locator("#generate-status")).to_contain_text("5 ideas")
    # The page's own thoughts stream relayed the provider's streamed text.
    expect(page.locator("#thoughts")).to_contain_text('"ideas"')

    page.get_by_label("Aspect ratio").select_option("16:9")
    page.get_by_role("button", name="Generate image").click()
    image = page.locator("#image")
    expect(image).to_have_attribute("src", re.compile(rf"^/uploads/{CANONICAL_UUID}\.webp$"))
    expect(page.locator("#image-caption")).to_contain_text("16:9 · fake-openai · fake-webp")
    page.wait_for_function(
        "document.getElementById('image').complete && document.getElementById('image').naturalWidth > 0"
    )
    served = http(wizard, "GET", image.get_attribute("src"))
    assert served.headers["Content-Type"] == "image/webp" and served.content[8:12] == b"WEBP"
    width, height = Image.open(io.BytesIO(served.content)).size
    assert width * 9 == height * 16  # the ratio asked for


# ---- Blueprints: likes, uploads -------------------------------------------------------------


def test_check_9_a_like_and_its_count_persist_across_a_reload(site, page, tmp_path):
    wizard = wizard_site(site, tmp_path)
    open_page(page, wizard.url + "/blueprints")
    create_blueprint(page, "Night bakery", {"name": "cover.png", "mimeType": "image/png", "buffer": png_bytes()})
    expect(page.locator("#blueprint-status")).to_have_text('Blueprint "Night bakery" created.')
    cover = page.get_by_role("img", name="Cover of Night bakery")
    expect(cover).to_have_attribute("src", re.compile(rf"^/uploads/{CANONICAL_UUID}\.png$"))
    page.wait_for_function("img => img.complete && img.naturalWidth === 48", arg=cover.element_handle())

    button = like_button(page, "Night bakery")
    expect(button).to_have_attribute("aria-pressed", "false")
    expect(button.locator(".like-count")).to_have_text("0")
    button.click()
    expect(button).to_have_attribute("aria-pressed", "true")
    expect(button.locator(".like-count")).to_have_text("1")

    page.reload()
    button = like_button(page, "Night bakery")
    expect(button).to_have_attribute("aria-pressed", "true")
    expect(button.locator(".like-count")).to_have_text("1")
    expect(button).to_have_accessible_name("Unlike Night bakery (1 like)")


def test_a_cover_of_the_wrong_type_or_over_8_mb_is_refused_with_the_apis_message(site, page, tmp_path):
    wizard = wizard_site(site, tmp_path)
    open_page(page, wizard.url + "/blueprints")
    create_blueprint(
        page,
        "Not an image",
        {"name": "cover.png", "mimeType": "image/png", "buffer": b"plain text pretending to be a PNG"},
    )
    error = page.locator("#blueprint-error")
    expect(error).to_have_text(
        "The cover image was not accepted: file: not a PNG, JPEG or WebP image (the type is read from the file's bytes)"
    )
    huge = tmp_path / "huge.png"  # over the API's limit, under nginx's (the API answers)
    huge.write_bytes(png_bytes() + b"\0" * (8 * 1024 * 1024))
    create_blueprint(page, "Too large", str(huge))
    expect(error).to_contain_text("The cover image was not accepted")
    expect(error).to_contain_text("8 MB")
    expect(page.locator("#gallery-status")).to_have_text("No blueprints yet: create the first one above.")
    assert http(wizard, "GET", "/api/collections/blueprints").json() == []


# ---- Live: two tabs --------------------------------------------------------------------------


def test_check_10_a_change_in_one_tab_shows_in_another_without_reload(site, context, tmp_path):
    wizard = wizard_site(site, tmp_path)
    first, second = context.new_page(), context.new_page()

    # A saved prompt made on the home page of one tab appears in the library of the other.
    open_page(first, wizard.url + "/")
    open_page(second, wizard.url + "/library")
    act_in(first).locator("#prompt-text").fill("Two tabs, one library")
    first.get_by_role("button", name="Save to library").click()
    expect(second.locator("#saved .prompt")).to_have_text(["Two tabs, one library"], timeout=LIVE_WITHIN_MS)

    # A blueprint and a like made in one gallery appear in the other.
    open_page(first, wizard.url + "/blueprints")
    open_page(second, wizard.url + "/blueprints")
    create_blueprint(act_in(first), "Shared board")
    expect(like_button(second, "Shared board")).to_be_visible(timeout=LIVE_WITHIN_MS)
    like_button(first, "Shared board").click()
    other = like_button(second, "Shared board")
    expect(other.locator(".like-count")).to_have_text("1", timeout=LIVE_WITHIN_MS)
    expect(other).to_have_attribute("aria-pressed", "true", timeout=LIVE_WITHIN_MS)  # same identity

    # A delete in one library disappears from the other.
    open_page(first, wizard.url + "/library")
    open_page(second, wizard.url + "/library")
    expect(second.locator("#saved .entry")).to_have_count(1)
    act_in(first).get_by_role("button", name="Delete the saved prompt").click()
    expect(second.locator("#saved .entry")).to_have_count(0, timeout=LIVE_WITHIN_MS)
    expect(second.locator("#saved-status")).to_contain_text("Nothing saved yet")


# ---- Admin ---------------------------------------------------------------------------------


def test_check_7_the_database_viewer_shows_the_seven_collections(
    site, context, browser, tmp_path, forward_auth_provider, fake_ai
):
    wizard = wizard_site(site, tmp_path, env=ai_env(fake_ai), provider=forward_auth_provider)
    sign_in(context, wizard, forward_auth_provider, "ada")
    page = context.new_page()
    open_page(page, wizard.url + "/admin")
    expect(page.locator(".who")).to_contain_text("Signed in as ada")
    buttons = page.locator("#collections [data-collection]")
    expect(buttons).to_have_count(7)
    assert buttons.evaluate_all("nodes => nodes.map(n => n.dataset.collection)") == SEVEN
    expect(page.locator("#collections")).not_to_contain_text("ideas")

    # Rows newest first: the seeded wizards; the filter box goes to ?filter=.
    expect(page.locator("#rows tbody tr")).to_have_count(3)
    assert page.locator("#rows tbody tr td:nth-child(2)").all_inner_texts() == sorted(
        page.locator("#rows tbody tr td:nth-child(2)").all_inner_texts(), reverse=True
    )
    page.get_by_label("Filter").fill('{"user_id": "nobody"}')
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#rows tbody tr")).to_have_count(0)
    page.get_by_label("Filter").fill('{"colour": "blue"}')
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#rows-status")).to_contain_text("unknown key 'colour'")
    page.get_by_role("button", name="Clear").click()
    expect(page.locator("#rows tbody tr")).to_have_count(3)

    # Admin prompts editing; the viewer follows live.
    page.get_by_label("Key", exact=True).last.fill("ideas.system")
    page.locator("#new-prompt-text").fill("Answer with JSON ideas.")
    page.get_by_role("button", name="Add prompt").click()
    expect(page.locator("#admin-prompts .entry")).to_have_count(1)
    expect(page.locator('[data-count-of="admin_prompts"]')).to_have_text("1")
    editor = page.locator("#admin-prompts .entry textarea")
    editor.fill("Answer with JSON ideas, five of them.")
    page.get_by_role("button", name="Save the admin prompt ideas.system").click()
    page.locator('[data-collection="admin_prompts"]').click()
    expect(page.locator("#rows tbody")).to_contain_text("Answer with JSON ideas, five of them.")

    # An AI call shows in the logs and timings with requested and resolved model.
    answer = page.evaluate("""() => fetch('/api/ai/text', {method: 'POST',
        headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({messages: [{role: 'user', content: 'ideas please'}], json: true, kind: 'ideas',
                              templateKey: 'test.ideas'})}).then(r => r.status)""")
    assert answer == 200
    timing = page.locator("#timings tbody tr").first
    expect(timing).to_contain_text("host default")
    expect(timing).to_contain_text("fake-ideas-5-resolved")
    expect(timing).to_contain_text("ok")
    expect(page.locator("#logs tbody tr").first).to_contain_text("host default → fake-ideas-5-resolved")

    # Readable at 360 px: the wide tables scroll inside their boxes, not the page.
    page.set_viewport_size({"width": 360, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    screenshot(page, "test_check_7_admin_at_360px")
    page.set_viewport_size({"width": 1200, "height": 800})

    # Anyone else gets the 403 page: a signed-in non-admin, and an anonymous visitor.
    for username in ("bo", None):
        other = browser.new_context()
        try:
            if username:
                sign_in(other, wizard, forward_auth_provider, username)
            refused = other.new_page()
            response = refused.goto(wizard.url + "/admin")
            assert response.status == 403
            expect(refused.get_by_role("heading", name="Administrators only")).to_be_visible()
            expect(refused.locator("#collections")).to_have_count(0)
            expect(refused.get_by_role("link", name="Admin")).to_have_count(0)
            screenshot(refused, f"test_check_7_admin_refused_to_{username or 'anonymous'}")
        finally:
            other.close()


# ---- Layout, errors, identity ------------------------------------------------------------------


def test_pages_are_readable_at_360_px_without_horizontal_scroll(site, context, tmp_path):
    wizard = wizard_site(site, tmp_path)
    long_word = "Supercalifragilisticexpialidocious" * 3
    for collection, row in (
        ("saved_prompts", {"title": long_word, "prompt": long_word}),
        ("prompt_history", {"prompt": long_word, "wizard_name": "Long"}),
        ("blueprints", {"title": long_word, "description": long_word, "is_public": True}),
    ):
        created = http(wizard, "POST", f"/api/collections/{collection}", json=row)
        assert created.status_code == 201, created.text
    page = context.new_page()
    page.set_viewport_size({"width": 360, "height": 740})
    for path, ready in (
        ("/", "#wizards-lists .card"),
        ("/blueprints", "#gallery .blueprint"),
        ("/library", "#history .entry"),
    ):
        open_page(page, wizard.url + path)
        expect(page.locator(ready).first).to_be_visible()
        if path == "/":
            page.get_by_role("button", name="Start the wizard Illustration brief").click()
            expect(page.locator("#steps-form")).to_be_visible()
        width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1] == 360, f"{path} scrolls sideways: {width}"
        screenshot(page, f"test_pages_at_360px_{path.strip('/') or 'home'}")


def test_client_errors_are_reported_to_the_service(site, page, tmp_path, capfd):
    wizard = wizard_site(site, tmp_path)
    open_page(page, wizard.url + "/")
    with page.expect_response(lambda r: r.url.endswith("/api/errors")) as reported:
        page.evaluate("setTimeout(() => { throw new Error('wizard page test: uncaught boom') }, 0)")
    assert reported.value.status == 204
    assert json.loads(reported.value.request.post_data)["message"] == "wizard page test: uncaught boom"
    with page.expect_response(lambda r: r.url.endswith("/api/errors")) as reported:
        page.evaluate("void Promise.reject(new Error('wizard page test: rejected'))")
    assert reported.value.status == 204
    # A failed fetch (the server's 404 is no failure of the client; a network error is).
    with page.expect_response(lambda r: r.url.endswith("/api/errors")) as reported:
        page.evaluate("import('/static/common.js').then(m => m.api('http://127.0.0.1:9/nothing')).catch(() => {})")
    assert reported.value.status == 204
    assert "network error" in json.loads(reported.value.request.post_data)["message"]
    log = capfd.readouterr().err
    assert "client: error: wizard page test: uncaught boom (user public)" in log
    assert "client: unhandledrejection: wizard page test: rejected (user public)" in log


def test_pages_without_an_identity_answer_401(site, page, tmp_path):
    wizard = wizard_site(site, tmp_path)
    for path in ("/", "/blueprints", "/library", "/admin"):
        response = page.goto(wizard.service.base_url + path)  # straight at gunicorn, not through nginx
        assert response.status == 401, path
        expect(page.get_by_role("heading", name="Sign-in required")).to_be_visible()
