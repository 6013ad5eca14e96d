"""Skills: `load_skill_file(path)` and `create_skills_adapter([...])`.

    skills = create_skills_adapter([load_skill_file("skills/review/SKILL.md")])
    engine = await create_engine(model, tools=skills.tools, instructions=skills.instructions)

A skill is one `SKILL.md`: front matter between ``---`` lines (``name``, ``description``,
and any other keys) and a Markdown body. `load_skill_file` reads that one file and nothing
it references (scripts, other Markdown files: the model can ask a tool of yours for them).
The adapter names every skill and its description in `instructions` and gives the model one
tool, `load_skill` (idempotent, no effects), that answers a skill's body by name; a skill's
own `tools` join the adapter's tools, each setting `idempotent` itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .codes import Code
from .errors import FxToolDefinitionError
from .tools.definition import Tool, ToolContext, check_tools

SKILL_FILE_MAX_BYTES = 256 * 1024
# A front matter value: text, or an indented list or map of text.
FrontMatterValue = str | list[str] | dict[str, str]

SKILL_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?")
DESCRIPTION_MAX_CHARS = 1024
LOAD_TOOL = "load_skill"


def _invalid(message: str) -> FxToolDefinitionError:
    """The error of a malformed `SKILL.md` or skill: `FX_SKILL_INVALID`."""
    return FxToolDefinitionError(message, code=Code.SKILL_INVALID)


@dataclass(frozen=True)
class Skill:
    """One skill.

    Attributes:
        name: 1 to 64 of lowercase letters, digits and `-` (not at either end).
        description: what the skill is for and when to load it (≤ 1024 characters).
        body: the instructions the model reads when it loads the skill.
        metadata: every other front matter key, as read.
        path: the file it was read from, if any.
        tools: tools the skill brings (each sets `idempotent` itself).
    """

    name: str
    description: str
    body: str
    metadata: Mapping[str, object] = field(default_factory=dict)
    path: str | None = None
    tools: Sequence[Tool] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SKILL_NAME.fullmatch(self.name):
            raise _invalid(f"skill name {self.name!r} must be 1 to 64 of a-z, 0-9 and '-' (not at either end)")
        if not isinstance(self.description, str) or not self.description.strip():
            raise _invalid(f"skill {self.name} needs a description")
        if len(self.description) > DESCRIPTION_MAX_CHARS:
            raise _invalid(f"skill {self.name}: the description is over {DESCRIPTION_MAX_CHARS} characters")
        if not isinstance(self.body, str):
            raise _invalid(f"skill {self.name}: the body must be text")
        object.__setattr__(self, "tools", tuple(check_tools(self.tools).values()))


# ---------------------------------------------------------------------------- front matter


def _scalar(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        inner = text[1:-1]
        if text[0] == '"':
            return inner.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        return inner.replace("''", "'")
    return text


def _block(lines: list[str], start: int, style: str) -> tuple[str, int]:
    """A `|` or `>` block scalar: the indented lines from `start`; (text, next index)."""
    taken: list[str] = []
    index = start
    while index < len(lines) and (not lines[index].strip() or lines[index][:1] in " \t"):
        taken.append(lines[index].strip())
        index += 1
    while taken and not taken[-1]:
        taken.pop()
    joined = "\n".join(taken) if style.startswith("|") else " ".join(t for t in taken if t)
    return joined, index


def parse_front_matter(text: str) -> tuple[dict[str, FrontMatterValue], str]:
    """(front matter, body) of a SKILL.md's text.

    The front matter is the YAML subset skills use: ``key: value`` lines (quoted or not),
    ``key: |`` / ``key: >`` block text, and one level of indented ``key: value`` maps or
    ``- item`` lists under a ``key:`` line. Anything else is `FX_SKILL_INVALID`.
    """
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise _invalid("a SKILL.md starts with front matter between '---' lines")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise _invalid("the front matter of a SKILL.md ends with a '---' line") from None
    meta: dict[str, FrontMatterValue] = {}
    index = 1
    while index < end:
        line = lines[index]
        if not line.strip() or line.lstrip().startswith("#"):
            index += 1
            continue
        if line[:1] in " \t" or ":" not in line:
            raise _invalid(f"front matter line {index + 1} is not 'key: value': {line.strip()[:80]!r}")
        key, _, rest = line.partition(":")
        key, rest = key.strip(), rest.strip()
        index += 1
        if rest[:1] in ("|", ">"):
            meta[key], index = _block(lines[:end], index, rest)
        elif rest:
            meta[key] = _scalar(rest)
        else:
            nested, index = _nested(lines[:end], index)
            meta[key] = nested
    body = "\n".join(lines[end + 1:]).strip("\n")
    return meta, body


def _nested(lines: list[str], start: int) -> tuple[list[str] | dict[str, str], int]:
    """The indented map or list under a bare ``key:`` line."""
    items: list[str] = []
    mapping: dict[str, str] = {}
    index = start
    while index < len(lines) and (not lines[index].strip() or lines[index][:1] in " \t"):
        item = lines[index].strip()
        index += 1
        if not item or item.startswith("#"):
            continue
        if item.startswith("- "):
            items.append(_scalar(item[2:]))
        elif ":" in item:
            sub, _, value = item.partition(":")
            mapping[sub.strip()] = _scalar(value)
        else:
            raise _invalid(f"front matter line {index}: {item[:80]!r} is neither 'key: value' nor '- item'")
    if items and mapping:
        raise _invalid("a front matter key holds either a map or a list, not both")
    return (items if items else mapping), index


# ---------------------------------------------------------------------------- loading


def load_skill_file(path: str | Path, *, tools: Sequence[Tool] = ()) -> Skill:
    """Reads one `SKILL.md` (UTF-8, ≤ 256 KiB): its front matter and body, nothing it references.

    Raises:
        FxToolDefinitionError: the file cannot be read, is too large, is not UTF-8, or its front
            matter lacks `name` or `description` (`FX_SKILL_INVALID`).
    """
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(SKILL_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise _invalid(f"cannot read skill file {file}: {exc.strerror or exc}") from exc
    if len(data) > SKILL_FILE_MAX_BYTES:
        raise _invalid(f"skill file {file} is over {SKILL_FILE_MAX_BYTES // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(f"skill file {file} is not UTF-8") from None
    meta, body = parse_front_matter(text)
    name, description = meta.pop("name", None), meta.pop("description", None)
    if not isinstance(name, str) or not isinstance(description, str):
        raise _invalid(f"skill file {file}: the front matter needs `name` and `description`")
    return Skill(name=name, description=description, body=body, metadata=meta, path=str(file), tools=tools)


# ---------------------------------------------------------------------------- the adapter


@dataclass(frozen=True)
class SkillsAdapter:
    """Skills as tools and instructions.

    Attributes:
        skills: the skills by name.
        tools: `load_skill`, then every skill's own tools.
        instructions: the list of skills the model may load, and how.
    """

    skills: Mapping[str, Skill]
    tools: list[Tool]
    instructions: str


def _instructions(skills: Iterable[Skill], tool_name: str) -> str:
    lines = [f"Skills hold instructions for particular tasks. When a task matches a skill, call "
             f"{tool_name} with its name and follow what it says. Skills:"]
    lines += [f"- {skill.name}: {skill.description}" for skill in skills]
    return "\n".join(lines)


def create_skills_adapter(skills: Iterable[Skill], *, tool_name: str = LOAD_TOOL) -> SkillsAdapter:
    """The tools and instructions that let a model load `skills` by name.

    Raises:
        FxToolDefinitionError: two skills of one name, or an item that is not a `Skill`.
        FxToolDefinitionError: two tools of one name among the skills' tools.
    """
    by_name: dict[str, Skill] = {}
    for skill in skills:
        if not isinstance(skill, Skill):
            raise _invalid(f"{skill!r} is not a Skill (use load_skill_file or Skill(...))")
        if skill.name in by_name:
            raise _invalid(f"two skills are named {skill.name}")
        by_name[skill.name] = skill

    def load(input: object, ctx: ToolContext) -> str:
        name = input.get("name") if isinstance(input, Mapping) else None  # the input is an object
        skill = by_name.get(name) if isinstance(name, str) else None
        if skill is None:
            raise ValueError(f"no skill named {name!r}; the skills are: {', '.join(by_name) or 'none'}")
        return skill.body

    schema = {"type": "object", "properties": {"name": {"type": "string", "enum": list(by_name)}},
              "required": ["name"]}
    loader = Tool(tool_name, "Loads the instructions of a skill by its name.", schema, idempotent=True,
                  writes=False, execute=load)
    tools = [loader, *(tool for skill in by_name.values() for tool in skill.tools)]
    check_tools(tools)
    return SkillsAdapter(skills=by_name, tools=tools, instructions=_instructions(by_name.values(), tool_name))
