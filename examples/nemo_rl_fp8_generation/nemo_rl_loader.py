"""Load NeMo RL's own FP8 quantizer from its source, at the commit fp8check reads (NVIDIA-NeMo/RL 7ea279ab), without
importing NeMo RL.

NeMo RL is not on PyPI, and `nemo_rl/models/generation/vllm/quantization/fp8.py` imports ray, vllm, accelerate and
transformers at module level, which a CPU CI box does not have, yet the quantizer itself needs only torch. So this
module reads that one file (checked against its SHA-256 at the pinned commit), parses it, and executes only these
definitions from it, in a namespace holding torch and NeMo RL's own `FP8Config`:

    FP8_BLOCK_QUANT_KWARGS           the block config NeMo RL starts vLLM with (fp8.py:37-42)
    FP8Config                        its FP8 settings dataclass (fp8.py:51-60)
    cast_tensor_to_fp8_blockwise     what its `load_weights` runs on every BF16 tensor of a refit (fp8.py:533-620)

The file is kept unmodified in third_party/nemo_rl/ (CI cannot reach GitHub); its hash is checked before any of it
runs. The function reads the module global `global_fp8_config`
(for `use_weight_pow2_scale`): each namespace sets it to an `FP8Config` of NeMo RL's own class. Its one `print`
(a padding notice) is routed to a list, `PADDED`.

Where the file comes from, first found:
  1. $NEMO_RL_SRC: the file itself, a NeMo RL checkout (its working tree) or its git directory (read with
     `git show <commit>:path`);
  2. third_party/nemo_rl/fp8.py in this repository (the file as published at the pinned commit);
  3. the cache, $XDG_CACHE_HOME/fp8check/nemo-rl-7ea279ab/fp8.py (default ~/.cache), which
     `python examples/nemo_rl_fp8_generation/nemo_rl_loader.py --fetch` fills from GitHub at the pinned commit
     and `--from-git GITDIR` fills from a local clone.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import os
import subprocess
import sys
import types

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
PATH = "nemo_rl/models/generation/vllm/quantization/fp8.py"
SHA256 = "cad1a6715104130e84c47f438ed617dc8e4ac9111e311bc825051336cc41f0a5"
URL = f"https://raw.githubusercontent.com/NVIDIA-NeMo/RL/{COMMIT}/{PATH}"
NAMES = ("FP8_BLOCK_QUANT_KWARGS", "FP8Config", "cast_tensor_to_fp8_blockwise")
FETCH = "python examples/nemo_rl_fp8_generation/nemo_rl_loader.py --fetch"
PADDED: list = []


class NemoRLUnavailable(ImportError):
    """NeMo RL's fp8.py at the pinned commit is not here."""


def cache_path() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "fp8check", f"nemo-rl-{COMMIT[:8]}", "fp8.py")


def _from_git(git_dir: str) -> bytes | None:
    try:
        return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{PATH}"], capture_output=True,
                              check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _candidates():
    src = os.environ.get("NEMO_RL_SRC")
    if src and os.path.isfile(src):                # the file itself
        with open(src, "rb") as f:
            yield f"{src} ($NEMO_RL_SRC)", f.read()
    elif src:
        tree = os.path.join(src, PATH)
        if os.path.isfile(tree):
            with open(tree, "rb") as f:
                yield f"{tree} ($NEMO_RL_SRC)", f.read()
        for git_dir in (src, os.path.join(src, ".git")):
            if os.path.isdir(git_dir):
                data = _from_git(git_dir)
                if data is not None:
                    yield f"{git_dir} at {COMMIT[:8]} ($NEMO_RL_SRC)", data
    vendored = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "third_party", "nemo_rl", "fp8.py")
    if os.path.isfile(vendored):
        with open(vendored, "rb") as f:
            yield vendored, f.read()
    cached = cache_path()
    if os.path.isfile(cached):
        with open(cached, "rb") as f:
            yield cached, f.read()


def why_not() -> str | None:
    """One line saying why NeMo RL's fp8.py cannot be loaded here, or None when it can."""
    try:
        source()
    except NemoRLUnavailable as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def source() -> tuple[str, str]:
    """(where it was read, the text) of fp8.py at the pinned commit; NemoRLUnavailable otherwise."""
    seen = []
    for where, data in _candidates():
        if hashlib.sha256(data).hexdigest() == SHA256:
            return where, data.decode("utf-8")
        seen.append(where)
    if seen:
        raise NemoRLUnavailable(f"NeMo RL's {PATH} found at {', '.join(seen)} is not the file at {COMMIT[:8]} "
                                f"(SHA-256 differs): check out {COMMIT[:8]}, or run `{FETCH}`")
    raise NemoRLUnavailable(f"NeMo RL's {PATH} at {COMMIT[:8]} is not here: run `{FETCH}` (or set NEMO_RL_SRC to a "
                            "NeMo RL checkout or its git directory)")


def _nodes(text: str) -> list:
    out = []
    for node in ast.parse(text).body:
        name = node.targets[0].id if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) else \
            getattr(node, "name", None)
        if name in NAMES:
            out.append(node)
    missing = set(NAMES) - {getattr(n, "name", None) or n.targets[0].id for n in out}
    if missing:
        raise NemoRLUnavailable(f"{PATH} at {COMMIT[:8]} lacks {sorted(missing)}")
    return out


@functools.lru_cache(maxsize=None)
def load(pow2: bool = False) -> types.SimpleNamespace:
    """NeMo RL's definitions, executed from its source, with `global_fp8_config = FP8Config(
    use_weight_pow2_scale=pow2)` (NeMo RL's own class): `.cast_tensor_to_fp8_blockwise`, `.FP8Config`,
    `.FP8_BLOCK_QUANT_KWARGS`, `.where` (the file it was read from)."""
    import torch
    where, text = source()
    # a module of its own (dataclasses look the class's module up in sys.modules), one per scale mode
    mod = types.ModuleType(f"nemo_rl_fp8_quantizer_{'pow2' if pow2 else 'fp32'}", f"NeMo RL {PATH} at {COMMIT[:8]}")
    sys.modules[mod.__name__] = mod
    ns = mod.__dict__
    ns.update(torch=torch, dataclass=dataclasses.dataclass, field=dataclasses.field,
              print=lambda *a, **k: PADDED.append(" ".join(map(str, a))))
    exec(compile(ast.Module(body=_nodes(text), type_ignores=[]), f"{where}:{PATH}", "exec"), ns)
    ns["global_fp8_config"] = ns["FP8Config"](use_weight_pow2_scale=pow2)
    return types.SimpleNamespace(where=where, **{n: ns[n] for n in NAMES})


def _store(data: bytes, how: str) -> str:
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256:
        raise SystemExit(f"{how}: SHA-256 {got} is not {SHA256} (NeMo RL {PATH} at {COMMIT[:8]}); nothing written")
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=f"put NeMo RL's {PATH} at {COMMIT[:8]} in fp8check's cache")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--fetch", action="store_true", help=f"download it from {URL}")
    g.add_argument("--from-git", metavar="GITDIR", help="read it from a local clone's git directory")
    a = p.parse_args(argv)
    if a.fetch:
        import urllib.request
        with urllib.request.urlopen(URL, timeout=60) as r:       # noqa: S310 - a fixed https URL
            data = r.read()
        print(_store(data, URL))
    else:
        data = _from_git(a.from_git)
        if data is None:
            raise SystemExit(f"{a.from_git}: no {PATH} at {COMMIT[:8]} (git show failed)")
        print(_store(data, a.from_git))
    return 0


if __name__ == "__main__":
    sys.exit(main())
