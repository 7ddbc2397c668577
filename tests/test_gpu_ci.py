"""The GPU CI as named jobs: one workflow (.github/workflows/gpu.yml) whose jobs are exactly ci/gpu_job.sh's, every
pytest phase names files that exist and every GPU test file is in a phase, no numbered plan and no raw results or
images in ci/, and a job's compact record is one the results page can render."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job_names() -> set[str]:
    text = open(os.path.join(ROOT, "ci", "gpu_job.sh")).read()
    body = text[text.index("case $JOB in"):text.index("esac")]
    names = set()
    for label in re.findall(r"^\s+([a-z0-9|-]+)\)", body, re.M):
        names.update(label.split("|"))
    return names


def _phases() -> dict[str, str]:
    text = open(os.path.join(ROOT, "ci", "gpu_session.sh")).read()
    return dict(re.findall(r'^\s+\[([a-z0-9-]+)\]="([^"]+)"', text, re.M))


def test_the_workflow_runs_exactly_the_named_jobs():
    wf = yaml.safe_load(open(os.path.join(ROOT, ".github", "workflows", "gpu.yml")))
    matrix = wf["jobs"]["gpu"]["strategy"]["matrix"]["job"]
    assert len(matrix) == len(set(matrix))
    assert set(matrix) == _job_names()
    steps = " ".join(str(s.get("run", "")) for s in wf["jobs"]["gpu"]["steps"])
    assert "bash ci/gpu_job.sh ${{ matrix.job }}" in steps
    assert os.listdir(os.path.join(ROOT, ".github", "workflows")) == ["gpu.yml"]


def test_every_phase_names_existing_tests_and_every_gpu_test_is_in_a_phase():
    phases = _phases()
    order = re.search(r'^ORDER="([^"]+)"', open(os.path.join(ROOT, "ci", "gpu_session.sh")).read(), re.M).group(1)
    assert set(order.split()) <= set(phases)
    covered = set()
    for name, spec in phases.items():
        files = spec.split(" -k ")[0].split()
        for f in files:
            assert os.path.isfile(os.path.join(ROOT, f)), f"phase {name}: {f} does not exist"
        covered.update(files)
    gpu_tests = {f"tests/gpu/{f}" for f in os.listdir(os.path.join(ROOT, "tests", "gpu")) if f.startswith("test_")}
    assert gpu_tests <= covered, f"in no phase: {sorted(gpu_tests - covered)}"
    pytest_jobs = {j for j in _job_names() if j in phases}
    assert set(order.split()) - {"triton"} <= pytest_jobs       # triton's cases run in job kernels


def test_ci_holds_no_numbered_plan_no_raw_results_and_no_images():
    files = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(os.path.join(ROOT, "ci")) for f in fs]
    assert not [f for f in files if re.search(r"\.(png|jpe?g|gif|svg|tgz|log|jsonl)$", f)], files
    assert not [f for f in files if "gpu_plan" in f or "results" in f.split(os.sep)[1]], files
    assert not os.path.exists(os.path.join(ROOT, "ci", "gpu.yml"))


def test_a_jobs_record_is_a_results_record(tmp_path):
    """ci/record.py's output, put in a results directory beside machines.json, passes the docs generator's checks
    and renders with the job's command and summary."""
    out = tmp_path / "rec.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "record.py"), "--job", "user", "--command",
                        "OUT=x bash ci/gpu_session.sh user", "--rc", "0", "--summary", "3 passed in 138.47s",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["figures"] == [{"what": "user", "value": "3 passed in 138.47s"}]
    spec = importlib.util.spec_from_file_location("fp8check_docs_hooks", os.path.join(ROOT, "docs", "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "machines.json").write_text(open(os.path.join(ROOT, "results", "machines.json")).read())
    hooks.RESULTS = str(tmp_path)
    assert [n for n, _ in hooks.load_records()] == ["rec.json"]
    page = hooks.results_markdown()
    assert "bash ci/gpu_job.sh user" in page and "| user | 3 passed in 138.47s |" in page
