"""The README is a front door: short, and every document it sends a reader to exists and is installed."""

from __future__ import annotations

import re

from tests.helpers import REPO

README = REPO / "README.md"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: reference and evidence belong in docs/"


def test_every_link_in_the_docs_resolves() -> None:
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def test_every_doc_is_installed_beside_the_readme() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f'"docs/{doc.name}"' in pyproject, f"{doc.name} is not in pyproject's data-files"


def test_every_config_key_is_in_the_reference_table() -> None:
    """docs/daemon.md's table lists every key migd's config accepts, no more and no fewer."""
    import re

    from migd.config.migdyaml import KEYS
    text = (REPO / "docs" / "daemon.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.M))
    assert listed == set(KEYS)
