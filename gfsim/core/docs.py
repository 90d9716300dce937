"""Where gfsim's documentation lives for a user: the site built from the source repository's
``docs/`` (mkdocs.yml's ``site_url``), not the Markdown files, which a pip install lacks. Help
texts and messages cite pages through here, so the base URL is stated once."""

from __future__ import annotations

import re

__all__ = ["DOCS_URL", "docs_url", "cite_docs"]

DOCS_URL = "https://gfsim.github.io/gfsim/"  # mkdocs.yml site_url; pyproject [project.urls]

_PAGE = re.compile(r"\bdocs/((?:[\w.-]+/)*[\w.-]+)\.md\b")


def docs_url(page: str) -> str:
    """The site's URL of a page of ``docs/`` (``how-to/replay-shinka.md``, with or without the
    leading ``docs/``; ``#anchor`` kept): MkDocs serves ``PAGE.md`` at ``PAGE/`` and
    ``index.md`` at its folder."""
    page, _, anchor = page.partition("#")
    page = page.removeprefix("docs/").removesuffix(".md")
    page = "" if page == "index" else page.removesuffix("/index") + "/"
    return DOCS_URL + page + (f"#{anchor}" if anchor else "")


def cite_docs(text: str) -> str:
    """``text`` with every ``docs/PAGE.md`` it names replaced by the page's URL."""
    return _PAGE.sub(lambda m: docs_url(m.group(1)), text)
