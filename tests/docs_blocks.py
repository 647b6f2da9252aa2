"""The fenced shell blocks of README.md and docs/*.md, and what each says its commands answer.

tests/test_docs_run.py runs them (docs/testing.md#docs-that-run). A block is fenced `sh`, `bash`,
`shell` or `console`; an HTML comment on the line right before its fence may say

- `<!-- not run: REASON -->`: it cannot run here, and why (GPU, Docker, hours of training, the
  installs `make` does). A reason may name the tests that run it instead as `tests/FILE.py::NAME`;
  a Docker block must name one of `make image-test`'s (tests/test_image.py, tests/test_scale_profile.py).
- `<!-- before: COMMANDS -->`: shell lines run first and not shown (a subject the block's commands
  need), as Rust's doctests hide set-up lines.

A `console` block's commands start with `$ `; the lines under one are its output, which must be what
it prints (`…` stands for anything). A `curl` command's expectation is read from its comments: a trailing `# 201` (any three digits
first) is its status; a sample answer beside it or on the comment lines right after it (`# {…}`,
elisions `[…]` `{…}` `"…"` allowed) is parsed as JSON: `{"error": {"code": C}}` means a 4xx with
code C, any other sample a 2xx whose keys (nested objects too) are the answer's and whose strings,
booleans, nulls and numbers (±0.002) are the answer's values (lists are illustrative: `[…]`). With
neither, any 2xx; `# 404 face_chip_not_stored` names the error code too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHELL = {"sh", "bash", "shell", "console"}
IMAGE_TESTS = ("tests/test_image.py", "tests/test_scale_profile.py")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"<!--\s*(not run|before):\s*(.*?)\s*-->\s*$", re.S)
NUMBER_TOLERANCE = 2e-3  # a similarity shown to 6 digits stays within it across onnxruntime builds
TEST_NAME = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


@dataclass(frozen=True)
class Expected:
    status: int | None = None  # an exact status, else any 2xx (or 4xx for an error sample)
    error: str | None = None  # the error code a sample `{"error": {"code": …}}` shows
    sample: dict | None = None  # a sample answer's JSON object


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None = None
    before: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def uses_server(self) -> bool:
        return "localhost:8000" in self.text

    @property
    def script(self) -> str:
        """What runs: the block, or a `console` block's `$ ` commands (and their continuation lines)."""
        return self.text if self.lang != "console" else "\n".join(command for command, _ in console_steps(self.text))

    def commands(self) -> list[Command]:
        return commands(self.script)


@dataclass(frozen=True)
class Command:
    text: str  # the command, continuation lines joined, its comment removed
    comment: str = ""  # its trailing comment and the comment lines right after it
    expected: Expected = field(default_factory=Expected)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The shell blocks of a markdown page, each with the marker right before its fence."""
    lines, found, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        if lang in SHELL:
            body = "\n".join(line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end])
            kind, detail = marker(lines[:i])
            found.append(
                Block(path, i + 1, lang, body, not_run=detail if kind == "not run" else None, before=detail if kind == "before" else "")
            )
        i = end + 1
    return found


def console_steps(text: str) -> list[tuple[str, str]]:
    """A `console` block's (command, the output shown under it): `$ ` starts a command."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if line.startswith("$ ") or continued:
            if continued:
                steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
            else:
                steps.append((line[2:], []))
            continued = line.endswith("\\")
        elif steps:
            steps[-1][1].append(line)
    return [(command, "\n".join(shown).strip()) for command, shown in steps]


def shows(shown: str, printed: str) -> bool:
    """The printed output is what a console block shows under its command (`…` stands for anything)."""
    pattern = ".*".join(re.escape(part.strip()) for part in shown.split("…"))
    return re.fullmatch(pattern, printed.strip(), re.S) is not None


def marker(above: list[str]) -> tuple[str | None, str]:
    """The `<!-- not run: … -->` or `<!-- before: … -->` comment ending on the line right before a fence."""
    if not above or not above[-1].rstrip().endswith("-->"):
        return None, ""
    start = next((k for k in range(len(above) - 1, -1, -1) if "<!--" in above[k]), None)
    m = MARKER.search("\n".join(above[start:])) if start is not None else None
    return (m.group(1), m.group(2)) if m else (None, "")


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its comment: a `#` outside quotes that starts a word."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), line[k + 1 :].strip()
    return line.rstrip(), ""


def commands(text: str) -> list[Command]:
    """The `curl` commands of a block, in order, each with its expectation."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        code, comment = split_comment(lines[i])
        while code.endswith("\\") and i + 1 < len(lines):
            i += 1
            more, comment = split_comment(lines[i])
            code = code[:-1].rstrip() + " " + more.strip()
        i += 1
        notes = [comment] if comment else []
        if i < len(lines) and not split_comment(lines[i])[0] and split_comment(lines[i])[1].startswith("{"):
            depth = 0  # a sample answer on the comment lines after the command, until its braces close
            while i < len(lines) and not split_comment(lines[i])[0] and lines[i].strip():
                following = split_comment(lines[i])[1]
                notes.append(following)
                depth += following.count("{") - following.count("}")
                i += 1
                if depth <= 0:
                    break
        if re.search(r"(^|[;&|(]\s*|\$\()curl\s", code.strip()):
            note = "\n".join(notes)
            found.append(Command(code.strip(), note, expectation(note)))
    return found


def expectation(note: str) -> Expected:
    status = re.match(r"(\d{3})\b(?:\s+([a-z]+(?:_[a-z]+)+)\b)?", note)
    sample = sample_json(note)
    error = sample.get("error", {}).get("code") if isinstance(sample, dict) and isinstance(sample.get("error"), dict) else None
    if status and status.group(2):
        error = status.group(2)
    return Expected(int(status.group(1)) if status else None, error, sample if isinstance(sample, dict) else None)


def sample_json(note: str) -> object | None:
    """The JSON object a comment shows, with its elisions made empty; None where it shows none."""
    start = note.find("{")
    if start < 0 or not re.fullmatch(r"(\d{3})?", note[:start].strip()):
        return None
    flat = " ".join(part.strip() for part in note[start:].splitlines())
    flat = flat.replace("[…]", "[]").replace("{…}", "{}").replace('"…"', '""')
    try:
        return json.JSONDecoder().raw_decode(flat)[0]
    except json.JSONDecodeError:
        return None  # a sketch such as {subjects, total, …}, not JSON


def mismatches(sample: dict, answer: object, at: str = "") -> list[str]:
    """How an answer differs from a sample where the sample is not illustrative: keys, strings, booleans, nulls."""
    if not isinstance(answer, dict):
        return [f"{at or 'the answer'} is not an object: {answer!r}"]
    if not sample:
        return []  # {…}: elided
    out = [f"{at}keys are {sorted(answer)}, the docs show {sorted(sample)}"] if set(sample) != set(answer) else []
    for key, shown in sample.items():
        real = answer.get(key)
        if isinstance(shown, dict):
            out += mismatches(shown, real, f"{at}{key}.")
        elif key in answer and not isinstance(shown, list) and not same(shown, real):
            out.append(f"{at}{key} is {real!r}, the docs show {shown!r}")
    return out


def same(shown: object, real: object) -> bool:
    """A shown value is the real one: numbers to the shown precision's neighbourhood (NUMBER_TOLERANCE)."""
    if isinstance(shown, (int, float)) and not isinstance(shown, bool):
        return isinstance(real, (int, float)) and not isinstance(real, bool) and abs(real - shown) <= NUMBER_TOLERANCE
    return shown == real


def unknown_tests(reason: str) -> list[str]:
    """The `tests/FILE.py::NAME` a reason names that do not exist."""
    missing = []
    for file, name in TEST_NAME.findall(reason):
        source = REPO / file
        if not source.is_file() or not re.search(rf"^\s*(async\s+)?def {name}\(", source.read_text(), re.M):
            missing.append(f"{file}::{name}")
    return missing
