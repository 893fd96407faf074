"""The README's Python examples run as written and print what their comments say."""

import contextlib
import importlib.util
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- readme-example: python"


def examples():
    """The ```python blocks that follow a readme-example marker, in order."""
    text = README.read_text(encoding="utf-8")
    return re.findall(re.escape(MARKER) + r"[^\n]*-->\n```python\n(.*?)```", text, flags=re.S)


def needs(code):
    """The top-level modules an example imports (import x / from x import y)."""
    return sorted({m.split(".")[0] for m in re.findall(r"^(?:import|from) ([\w.]+)", code, flags=re.M)})


def run(code):
    """Runs the example; checks each printed line against the `# expected` comment of its print()."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    expected = [line.split("#", 1)[1].split(":")[0].strip() for line in code.splitlines()
                if line.startswith("print(") and "#" in line]
    lines = printed.getvalue().splitlines()
    assert lines == expected, f"printed {lines}; the README says {expected}"


def test_readme_has_numpy_and_torch_examples():
    kinds = [needs(code) for code in examples()]
    assert ["attn", "numpy"] in kinds and any("torch" in k for k in kinds), kinds


@pytest.mark.parametrize("index", range(len(examples())))
def test_example(index):
    code = examples()[index]
    missing = [m for m in needs(code) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"README example {index + 1} needs {', '.join(missing)}, not installed")
    run(code)
