"""mkdocs hook: relative links are written as they resolve in the repository, so that they hold on GitHub too.

The site's docs_dir is docs/, and it serves benchmarks/ as docs/benchmarks (a symbolic link), so a page's folder in
the repository is docs/<folder> or benchmarks/<folder>. A link from benchmarks/results/x.md to an investigation is
written `../../docs/investigations/y.md` (GitHub's view); here it becomes `../../investigations/y.md` (the site's),
before mkdocs checks it. A link that already holds in the site (docs/index.md's `benchmarks/README.md`) is left as
it is, and so is one that leads outside docs/ and benchmarks/ (mkdocs then warns of it, as it would anyway)."""

from __future__ import annotations

import posixpath
import re

LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def repo_folder(src_uri: str) -> str:
    """The folder in the repository of the page at `src_uri` (its path in the site's docs)."""
    folder = posixpath.dirname(src_uri)
    return folder if src_uri.startswith("benchmarks/") else posixpath.join("docs", folder)


def site_path(repo_path: str) -> str | None:
    """Where a file of the repository is in the site's docs, or None when the site does not serve it."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path.startswith("benchmarks/"):
        return repo_path
    return None


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    src_uri = page.file.src_uri

    def relink(match: re.Match) -> str:
        target = match.group(2)
        path, hash_, anchor = target.partition("#")
        if not path or path.startswith("/") or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", path):
            return match.group(0)
        in_site = site_path(posixpath.normpath(posixpath.join(repo_folder(src_uri), path)))
        if in_site is None:
            return match.group(0)
        new = posixpath.relpath(in_site, posixpath.dirname(src_uri) or ".")
        return match.group(1) + new + hash_ + anchor + match.group(3)

    return LINK.sub(relink, markdown)
