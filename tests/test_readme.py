"""The README's "Check your own job" snippets run as written: the pytest-plugin one here (a user's test file,
verbatim, run by pytest in its own process with the plugin from the `pytest11` entry point); the vLLM one needs a
GPU (tests/gpu/test_user_engine.py)."""
import os
import re
import subprocess
import sys

from readme_snippets import snippet, ROOT


def test_the_plugin_snippet_runs_verbatim(tmp_path):
    (tmp_path / "test_readme_snippet.py").write_text(snippet("pytest"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"\b2 passed\b", out.strip().splitlines()[-1]), out[-2000:]


def test_every_snippet_marker_finds_its_block():
    text = open(os.path.join(ROOT, "README.md")).read()
    names = re.findall(r"<!-- snippet: (\S+) -->", text)
    assert sorted(names) == ["pytest", "vllm"]
    for n in names:
        assert snippet(n).strip()
