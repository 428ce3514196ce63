"""MkDocs hook: the README and benchmarks/RESULTS.md as pages of the site.

They live outside ``docs/`` (GitHub shows them at the top of the repository), so the
site generates ``readme.md`` and ``benchmarks.md`` from them and rewrites the links
between them and the pages, which stay valid on GitHub as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = {"readme.md": ROOT / "README.md", "benchmarks.md": ROOT / "benchmarks" / "RESULTS.md"}


def _rewrite(markdown: str, page: str) -> str:
    if page in OUTSIDE:  # links from the repository root or benchmarks/ into docs/
        markdown = re.sub(r"\]\((?:\.\./)?docs/([\w-]+\.md)", r"](\1", markdown)
        markdown = markdown.replace("](benchmarks/RESULTS.md)", "](benchmarks.md)")
        markdown = markdown.replace("](RESULTS.md)", "](benchmarks.md)")
        # other files of the repository (scripts, tests) are not pages: plain text
        markdown = re.sub(r"\[([^\]]+)\]\((?!https?:)(?![\w-]+\.md)([^)]+)\)", r"\1 (`\2`)", markdown)
    markdown = markdown.replace("](../README.md)", "](readme.md)")
    return markdown.replace("](../benchmarks/RESULTS.md)", "](benchmarks.md)")


def on_files(files, config):
    for name, path in OUTSIDE.items():
        files.append(File.generated(config, name, content=path.read_text()))
    return files


def on_page_markdown(markdown, page, config, files):
    return _rewrite(markdown, page.file.src_uri)
