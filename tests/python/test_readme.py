"""The Python examples of the README and of the pages of docs/ run as written and print what their comments say."""

import contextlib
import importlib.util
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
MARKER = "<!-- example: python"


def examples(path):
    """The ```python blocks of a page that follow an example marker, in order."""
    text = path.read_text(encoding="utf-8")
    return re.findall(re.escape(MARKER) + r"[^\n]*-->\n```python\n(.*?)```", text, flags=re.S)


# (page, index on that page, code) for every example, with an id such as "README.md-1" or "docs/python.md-3".
ALL = [(page, i, code) for page in PAGES for i, code in enumerate(examples(page))]
IDS = ["%s-%d" % (page.relative_to(ROOT), i + 1) for page, i, _ in ALL]


def needs(code):
    """The top-level modules an example imports (import x / from x import y)."""
    return sorted({m.split(".")[0] for m in re.findall(r"^(?:import|from) ([\w.]+)", code, flags=re.M)})


def run(page, code):
    """Runs the example; checks each printed line against the `# expected` comment of its print()."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(page), "exec"), {"__name__": "readme_example"})
    expected = [line.split("#", 1)[1].split(":")[0].strip() for line in code.splitlines()
                if line.startswith("print(") and "#" in line]
    lines = printed.getvalue().splitlines()
    assert lines == expected, f"printed {lines}; {page.name} says {expected}"


def test_readme_has_numpy_and_torch_examples():
    kinds = [needs(code) for code in examples(README)]
    assert ["attn", "numpy"] in kinds and any("torch" in k for k in kinds), kinds


def test_every_marked_block_is_found():
    """A marker whose block the pattern misses (a typo, a blank line) would silently drop an example."""
    for page in PAGES:
        assert page.read_text(encoding="utf-8").count(MARKER) == len(examples(page)), page


@pytest.mark.parametrize("page,index,code", ALL, ids=IDS)
def test_example(page, index, code):
    missing = [m for m in needs(code) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{page.name} example {index + 1} needs {', '.join(missing)}, not installed")
    run(page, code)
