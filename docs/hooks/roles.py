"""MkDocs hook: Sphinx roles in docstrings become cross-references.

Docstrings name other objects the Sphinx way (``:class:`fdp.Gaussian```,
``:meth:`~fdp_tf.DPOptimizer.apply```), which mkdocstrings renders as raw text. After a
page is rendered, every role is replaced by an autorefs cross-reference: a link where
the object is documented in the reference, plain code where it is not (``optional``: a
private module is not a broken link). ``~`` shows the last component only, as in Sphinx.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|py:\w+):<code>(~?)([\w.]+)(\(\))?</code>")


def _autoref(match: re.Match[str]) -> str:
    tilde, identifier, call = match.group(1), match.group(2), match.group(3) or ""
    shown = identifier.rsplit(".", 1)[-1] if tilde else identifier
    return f'<autoref identifier="{identifier}" optional><code>{shown}{call}</code></autoref>'


def on_page_content(html, page, config, files):
    return ROLE.sub(_autoref, html)
