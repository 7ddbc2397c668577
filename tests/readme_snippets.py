"""The README's runnable snippets and checked outputs, found by their markers: `<!-- snippet: NAME -->` before a
```python block (tests/test_readme.py runs the CPU ones, tests/gpu/test_user_engine.py the vLLM one, verbatim) and
`<!-- output: NAME -->` before a ```console block of `$ command` lines and the output each must print
(tests/test_readme.py runs them). A docs page may carry the same marker: its block must then be the README's."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _block(kind: str, lang: str, name: str, path: str) -> str:
    text = open(path).read()
    m = re.search(r"<!-- " + kind + ": " + re.escape(name) + r" -->\s*```" + lang + r"\n(.*?)```", text, re.S)
    if m is None:
        raise LookupError(f"{os.path.relpath(path, ROOT)} has no {kind} {name!r} (a `<!-- {kind}: {name} -->` line "
                          f"before a ```{lang} block)")
    return m.group(1)


def snippet(name: str, path: str = os.path.join(ROOT, "README.md")) -> str:
    return _block("snippet", "python", name, path)


def output(name: str, path: str = os.path.join(ROOT, "README.md")) -> str:
    return _block("output", "console", name, path)


def markers(kind: str, path: str = os.path.join(ROOT, "README.md")) -> list[str]:
    return re.findall(r"<!-- " + kind + r": (\S+) -->", open(path).read())
