"""The README's runnable snippets, found by their `<!-- snippet: NAME -->` marker: the code block right after it,
verbatim (tests/test_readme.py runs the CPU ones, tests/gpu/test_user_engine.py the vLLM one)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snippet(name: str) -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- snippet: " + re.escape(name) + r" -->\s*```python\n(.*?)```", text, re.S)
    if m is None:
        raise LookupError(f"README.md has no snippet {name!r} (a `<!-- snippet: {name} -->` line before a ```python block)")
    return m.group(1)
