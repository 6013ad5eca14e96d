"""Fixtures of the rolling-upgrade test: the previous release's tree and a deployment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.upgrade.deployment import Deployment
from tests.upgrade.previous import Tree, current_tree, imported_from, materialise


@pytest.fixture(scope="module")
def previous() -> Iterator[Tree]:
    """The previous release's tree; its processes import its own packages, not this checkout's."""
    with materialise() as tree:
        files = imported_from(tree)
        strays = {name: path for name, path in files.items() if not path.startswith(str(tree.root))}
        assert not strays, f"the previous release's processes would import {strays}, not {tree.root}"
        yield tree


@pytest.fixture
def deployment(previous: Tree) -> Iterator[Deployment]:
    d = Deployment(previous, current_tree())
    try:
        yield d
    finally:
        d.close()
