"""fxengine.skills: a SKILL.md loaded from disk and used by a model in a turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxengine import FxToolDefinitionError, Tool
from fxengine.skills import Skill, create_skills_adapter, load_skill_file, parse_front_matter
from fxengine.testing import Reply, ScriptedModel, text, tool_call

from .conftest import run

REVIEW = """---
name: code-review
description: "Reviews a change: correctness first, then style."
license: Apache-2.0
metadata:
  author: the team
  version: "2"
allowed-tools:
  - read_file
notes: >
  folded
  text
---
# Reviewing

1. Read `checklist.md` next to this file.
2. Say what is wrong before what is ugly.
"""


@pytest.fixture
def skill_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "review"
    folder.mkdir()
    (folder / "SKILL.md").write_text(REVIEW, encoding="utf-8")
    (folder / "checklist.md").write_text("SECRET CHECKLIST CONTENT", encoding="utf-8")
    return folder


def test_a_skill_file_is_its_front_matter_and_body_only(skill_dir: Path) -> None:
    skill = load_skill_file(skill_dir / "SKILL.md")
    assert skill.name == "code-review"
    assert skill.description == "Reviews a change: correctness first, then style."
    assert skill.body.startswith("# Reviewing") and skill.body.endswith("before what is ugly.")
    assert skill.metadata == {"license": "Apache-2.0", "metadata": {"author": "the team", "version": "2"},
                              "allowed-tools": ["read_file"], "notes": "folded text"}
    assert "SECRET" not in repr(skill)  # the file it references is not read
    assert skill.path == str(skill_dir / "SKILL.md")


@pytest.mark.parametrize(
    "content",
    [
        "no front matter",
        "---\nname: x\n",  # never closed
        "---\ndescription: no name\n---\nbody",
        "---\nname: Bad_Name\ndescription: d\n---\nbody",
        "---\nname: ok\ndescription: d\n  stray indent\n---\nbody",
    ],
)
def test_a_malformed_skill_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "SKILL.md"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(FxToolDefinitionError) as refused:
        load_skill_file(path)
    assert refused.value.code == "FX_SKILL_INVALID"


def test_unreadable_or_oversized_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FxToolDefinitionError, match="cannot read"):
        load_skill_file(tmp_path / "missing.md")
    big = tmp_path / "SKILL.md"
    big.write_text("---\nname: big\ndescription: d\n---\n" + "x" * 300_000, encoding="utf-8")
    with pytest.raises(FxToolDefinitionError, match="KiB"):
        load_skill_file(big)


def test_front_matter_quotes_and_blocks() -> None:
    meta, body = parse_front_matter("---\na: 'it''s'\nb: \"q\\\"q\"\nc: |\n  line 1\n  line 2\n---\n\nbody\n")
    assert meta == {"a": "it's", "b": 'q"q', "c": "line 1\nline 2"} and body == "body"


async def test_a_model_loads_a_skill_and_follows_it(skill_dir: Path, model: ScriptedModel, make_engine: Any) -> None:
    async def post_comment(input: dict[str, Any], ctx: Any) -> str:
        return "posted"

    comment = Tool("post_comment", "Posts a review comment.", {"type": "object"}, idempotent=False, execute=post_comment)
    skills = create_skills_adapter([load_skill_file(skill_dir / "SKILL.md", tools=[comment])])
    assert [t.name for t in skills.tools] == ["load_skill", "post_comment"]
    assert skills.tools[0].idempotent and not skills.tools[0].writes and not skills.tools[1].idempotent
    model.script(
        Reply(tool_call("c1", "load_skill", {"name": "code-review"})),
        Reply(tool_call("c2", "post_comment", {})),
        Reply(text("reviewed")),
    )
    engine = await make_engine(tools=skills.tools, instructions=skills.instructions)
    events, result = await run(engine.prompt("review my change"))
    assert result.stop_reason == "end_turn"
    system = model.requests[0].body["messages"][0]
    assert system["role"] == "system"
    assert "- code-review: Reviews a change: correctness first, then style." in system["content"]
    loaded = next(m for m in model.requests[1].body["messages"] if m["role"] == "tool")
    assert loaded["content"] == load_skill_file(skill_dir / "SKILL.md").body
    assert "SECRET" not in str(model.requests[1].body)
    assert [e["content"] for e in events if e["type"] == "tool_end"][1] == "posted"


async def test_an_unknown_skill_is_a_failed_call(model: ScriptedModel, make_engine: Any) -> None:
    skills = create_skills_adapter([Skill("greet", "Greets.", "Say hello.")])
    model.script(Reply(tool_call("c1", "load_skill", {"name": "nope"})), Reply(text("ok")))
    engine = await make_engine(tools=skills.tools)
    events, _ = await run(engine.prompt("go"))
    end = next(e for e in events if e["type"] == "tool_end")
    assert end["isError"] and "greet" in end["content"]


def test_two_skills_of_one_name_are_refused() -> None:
    with pytest.raises(FxToolDefinitionError) as refused:
        create_skills_adapter([Skill("a", "d", "b"), Skill("a", "d", "c")])
    assert refused.value.code == "FX_SKILL_INVALID"
