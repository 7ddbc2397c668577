"""The vLLM version facts (harness.engines.vllm_api) held to vLLM's own files: every step's marker stands in the
cited file exactly in the releases of that step. Read as text from the unpacked releases in /tmp/src/vllm-X or
the wheels in /tmp/wheels (no vLLM import); a release found in neither is skipped by name."""
import glob
import os
import zipfile

import pytest

from fp8check.harness.engines.vllm_api import FACTS, READ_RELEASES, UnsupportedVLLM, facts_for, parse_version

SRC = os.environ.get("FP8CHECK_VLLM_SRC", "/tmp/src")
WHEELS = os.environ.get("FP8CHECK_VLLM_WHEELS", "/tmp/wheels")


def _tree(version):
    d = os.path.join(SRC, f"vllm-{version}")
    if os.path.isdir(os.path.join(d, "vllm")):
        return ("dir", d)
    whl = sorted(glob.glob(os.path.join(WHEELS, f"vllm-{version}-*.whl")))
    return ("whl", whl[0]) if whl else None


def read(version, path):
    """The text of `path` in release `version`; None where the release has no such file."""
    tree = _tree(version)
    if tree is None:
        pytest.skip(f"vLLM {version}'s files are not here ({SRC}/vllm-{version} or {WHEELS}/vllm-{version}-*.whl)")
    path = path.format(version=version)
    if tree[0] == "dir":
        p = os.path.join(tree[1], path)
        return open(p, encoding="utf-8").read() if os.path.isfile(p) else None
    with zipfile.ZipFile(tree[1]) as z:
        try:
            return z.read(path).decode("utf-8")
        except KeyError:
            return None


def _in_step(fact, i, version):
    v = parse_version(version)
    lo = parse_version(fact.steps[i].since)
    hi = parse_version(fact.steps[i + 1].since) if i + 1 < len(fact.steps) else None
    return lo <= v and (hi is None or v < hi)


CASES = [(f.name, i, r) for f in FACTS.values() for i, s in enumerate(f.steps) if s.marker for r in READ_RELEASES]


@pytest.mark.parametrize("name,step,release", CASES, ids=[f"{n}-{i}-{r}" for n, i, r in CASES])
def test_marker_stands_exactly_in_its_releases(name, step, release):
    fact = FACTS[name]
    s = fact.steps[step]
    text = read(release, s.file)
    present = text is not None and s.marker in text
    expected = _in_step(fact, step, release)
    where = s.file.format(version=release)
    assert present == expected, (f"{name}: {s.marker!r} {'missing from' if expected else 'found in'} {where} of "
                                 f"vLLM {release} (the fact says from {s.since} until the next step)")


def test_every_step_after_the_first_is_pinned_by_some_marker():
    # a step without a marker must be bounded by a neighbour's marker (its absence is then what the test reads)
    for f in FACTS.values():
        since = [parse_version(s.since) for s in f.steps]
        assert since == sorted(since) and len(set(since)) == len(since), f.name
        assert since[0] == parse_version(READ_RELEASES[0]), f.name
        for i, s in enumerate(f.steps):
            if s.marker is None:
                assert any(t.marker for t in f.steps[max(i - 1, 0):i + 2]), f"{f.name}: step {s.since} unpinned"


def test_resolution_by_release():
    # the values read off vLLM's files by hand (METADATA's torch pin; envs.py; gpu_worker.py), stated here apart
    assert (facts_for("0.26.0").torch, facts_for("0.30.0").torch, facts_for("0.34.0").torch) == \
        ("2.11.0", "2.13.0", "2.14.0")
    assert not facts_for("0.31.0").weight_checksums and facts_for("0.32.0").weight_checksums
    assert facts_for("0.30.0").reload_lifecycle == "layerwise" and facts_for("0.34.0").reload_lifecycle == "lifecycle"
    assert facts_for("0.26.0").trainer_transfer is None
    assert facts_for("0.30.0").trainer_transfer == "IPCTrainerWeightTransferEngine"
    assert facts_for("0.30.0").weight_source_form == "iter" and facts_for("0.33.0").weight_source_form == "iter_full"
    assert facts_for("0.34.0").direct_reload("direct") and not facts_for("0.34.0").direct_reload(None)
    assert not facts_for("0.30.0").direct_reload("direct")        # the variable means nothing before 0.34
    assert facts_for("0.30.0+cu130").version == "0.30.0" and facts_for("0.34.1rc2").verified
    assert not facts_for("0.35.0").verified and facts_for("0.35.0").torch == "2.14.0"


def test_bad_versions_are_one_line():
    with pytest.raises(UnsupportedVLLM, match="older than 0.26.0"):
        facts_for("0.25.9")
    with pytest.raises(UnsupportedVLLM, match="not a release number"):
        facts_for("main")
    with pytest.raises(AttributeError, match="no vLLM fact 'reload_mod'"):
        facts_for("0.30.0").reload_mod


def test_the_docs_table_names_every_fact():
    doc = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "vllm-versions.md")).read()
    missing = [n for n in FACTS if f"`{n}`" not in doc]
    assert not missing, f"docs/vllm-versions.md does not name the vLLM facts {missing}"
