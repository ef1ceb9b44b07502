"""Markdown deck source → slides.

- Slides are split on `---` lines outside code fences.
- A leading front-matter block (`---` … `---`, YAML mapping) gives the title.
- Speaker notes: everything after a `Note:` (or `Notes:`) line, and the text of
  `<!-- notes: … -->` comments.
- Image references are rewritten by a `resolve_image(src) -> url | None` callback;
  an unresolved reference is kept as written and reported in the warnings.
- Slides are rendered to HTML with raw HTML disabled, so a deck cannot inject
  script into the review page.
"""

import re

import yaml
from markdown_it import MarkdownIt

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SEPARATOR = re.compile(r"^---\s*$")
_NOTE_LINE = re.compile(r"^\s*notes?:\s?(.*)$", re.IGNORECASE)
_NOTE_COMMENT = re.compile(r"<!--\s*notes?:(.*?)-->", re.IGNORECASE | re.DOTALL)
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$")

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])


class DeckSyntaxError(ValueError):
    pass


def _split_front_matter(lines):
    """(front-matter dict, remaining lines)."""
    if not lines or not _SEPARATOR.match(lines[0]):
        return {}, lines
    for end in range(1, len(lines)):
        if _SEPARATOR.match(lines[end]) or lines[end].strip() == "...":
            try:
                meta = yaml.safe_load("\n".join(lines[1:end])) or {}
            except yaml.YAMLError as exc:
                raise DeckSyntaxError(f"the front matter is not valid YAML: {exc}") from None
            if isinstance(meta, dict):
                return meta, lines[end + 1 :]
            return {}, lines  # a first slide that happens to sit between two rules
    return {}, lines


def _split_slides(lines):
    """Lists of lines, split on separators outside fences; blank slides dropped."""
    slides, current, fence = [], [], None
    for line in lines:
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif (
            fence is not None
            and opening
            and opening.group(1)[0] == fence[0]
            and len(opening.group(1)) >= len(fence)
            and not line.strip()[len(opening.group(1)) :].strip()
        ):
            fence = None
        elif fence is None and _SEPARATOR.match(line):
            slides.append(current)
            current = []
            continue
        current.append(line)
    slides.append(current)
    return [s for s in slides if any(line.strip() for line in s)]


def _split_notes(lines):
    """(body lines, notes text) of one slide."""
    body, notes, fence = [], [], None
    for number, line in enumerate(lines):
        opening = _FENCE.match(line)
        if opening:
            fence = None if fence else opening.group(1)
        match = _NOTE_LINE.match(line) if fence is None else None
        if match:
            notes.append("\n".join([match.group(1)] + lines[number + 1 :]).strip())
            break
        body.append(line)
    text = "\n".join(body)
    notes = [m.strip() for m in _NOTE_COMMENT.findall(text)] + notes
    return _NOTE_COMMENT.sub("", text).strip(), "\n\n".join(n for n in notes if n)


def _render(text, resolve_image, slide_number, warnings):
    tokens = _markdown.parse(text)
    referenced = []
    for token in tokens:
        for child in token.children or ():
            if child.type != "image":
                continue
            src = child.attrGet("src") or ""
            url = resolve_image(src)
            if url is None:
                warnings.append(f"slide {slide_number}: image {src!r} is not among the copied assets")
            else:
                child.attrSet("src", url)
                referenced.append(url)
    return _markdown.renderer.render(tokens, _markdown.options, {}), referenced


def parse_deck(source, resolve_image):
    """A dict {title, meta, slides, warnings} parsed from the Markdown `source`."""
    meta, lines = _split_front_matter(source.splitlines())
    warnings, slides = [], []
    for index, slide_lines in enumerate(_split_slides(lines)):
        body, notes = _split_notes(slide_lines)
        html, images = _render(body, resolve_image, index + 1, warnings)
        heading = next((m.group(1) for m in map(_HEADING.match, body.splitlines()) if m), None)
        slides.append(
            {"index": index, "title": heading, "markdown": body, "html": html, "notes": notes, "images": images}
        )
    title = meta.get("title") if isinstance(meta.get("title"), str) else None
    if not title:
        title = next((s["title"] for s in slides if s["title"]), None)
    return {"title": title, "meta": _plain(meta), "slides": slides, "warnings": warnings}


def _plain(value):
    """Front matter made JSON-safe (YAML may hold dates and other types)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
