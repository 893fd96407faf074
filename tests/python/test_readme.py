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
    blocks = re.findall(re.escape(MARKER) + r"[^\n]*-->\n```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2, "README.md should hold a NumPy and a PyTorch example"
    return blocks


def run(code):
    """Runs the example; checks each printed line against the `# expected` comment of its print()."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    expected = [line.split("#", 1)[1].split(":")[0].strip() for line in code.splitlines()
                if line.startswith("print(") and "#" in line]
    lines = printed.getvalue().splitlines()
    assert lines == expected, f"printed {lines}; the README says {expected}"


def test_numpy_example():
    code = next(b for b in examples() if "import torch" not in b)
    run(code)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed; the README's "
                    "PyTorch example needs it")
def test_pytorch_example():
    code = next(b for b in examples() if "import torch" in b)
    run(code)
