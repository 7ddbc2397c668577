"""One compact record of a GPU CI job, in the format of results/*.json (docs/hooks.py renders those into the results
page): the command, the commit, the date, the machine and the job's summary line. A record worth keeping is
copied into results/ with its figures stated; the raw logs stay CI artifacts."""
import argparse
import datetime
import json
import subprocess


def _out(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--rc", type=int, required=True)
    ap.add_argument("--summary", default="")
    ap.add_argument("--machine", default="h200", help="a key of results/machines.json")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    gpu = _out("nvidia-smi", "--query-gpu=name", "--format=csv,noheader").splitlines()
    record = {"title": f"GPU CI job {a.job}", "section": "GPU CI", "machine": a.machine,
              "date": datetime.date.today().isoformat(), "commit": _out("git", "rev-parse", "--short=7", "HEAD"),
              "command": f"bash ci/gpu_job.sh {a.job}  ({a.command})",
              "about": f"exit status {a.rc}; GPU seen: {', '.join(gpu) or 'none'}",
              "figures": [{"what": a.job, "value": a.summary or f"exit status {a.rc}, no summary line"}]}
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
