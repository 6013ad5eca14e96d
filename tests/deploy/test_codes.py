"""The `FX_` codes: one registry (`fxengine.codes.Code`), used by name at every site that
raises or reports one, and each documented in README.md or docs/."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from fxengine.codes import Code

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "fxengine").rglob("*.py"), *(ROOT / "fxworker").rglob("*.py")])
DOCS = "".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
# Settings are FX_ names too: the variables of docs/reference.md's configuration table.
SETTINGS = set(re.findall(r"^\| `(FX_[A-Z0-9_]+)` \|", DOCS.split("## HTTP API")[0], re.M)) | {"FX_URL", "FX_WAKE_SECRET"}


def test_every_code_is_documented() -> None:
    missing = [c.value for c in Code if not re.search(re.escape(c.value) + r"(?![A-Z0-9_])", DOCS)]
    assert missing == [], f"codes no doc names: {missing}"


def test_no_code_is_written_as_a_literal() -> None:
    """A code outside the registry is an `FX_` string that is not a setting's name."""
    literals = []
    for path in SOURCES:
        if path.name == "codes.py":
            continue
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING and re.fullmatch(r"[\"']FX_[A-Z0-9_]+[\"']", token.string):
                name = token.string[1:-1]
                if name not in SETTINGS:
                    literals.append(f"{path.relative_to(ROOT)}:{token.start[0]} {name}")
    assert literals == [], "use fxengine.codes.Code (and add new codes there):\n" + "\n".join(literals)


def test_a_code_is_its_value() -> None:
    import json

    assert Code.PROVIDER_TIMEOUT == "FX_PROVIDER_TIMEOUT" and f"{Code.STORE_FULL}" == "FX_STORE_FULL"
    assert json.dumps({"code": Code.FENCED}) == '{"code": "FX_FENCED"}'
    assert len({c.value for c in Code}) == len(Code)
