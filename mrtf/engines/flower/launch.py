"""Start the mrtf Flower App and exit like an mrtf command: 0 when the run completed, 2 with
one line ``mrtf: error: ...`` on stderr when the ServerApp stopped on bad input (a bad run
config, fewer usable parties than ``min-parties``), 1 when Flower failed otherwise.

    python -m mrtf.engines.flower.launch [SUPERLINK] [--run-config 'key=value ...'] ...

``flwr run`` itself exits 0 whatever happened to the run, so this runs it (``--stream``: the
run's log is shown as it goes), then asks the SuperLink for the run's status (``flwr ls``).
It works from any machine that can reach the SuperLink's Control API, as ``flwr run`` does.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from mrtf.engines.flower import APP_DIR

MARK = "mrtf: error: "


def flwr() -> str:
    exe = Path(sys.executable).parent / "flwr"
    return str(exe) if exe.exists() else "flwr"


def run_status(superlink: list[str], run_id: str, wait_s: float = 30.0) -> tuple[str, str]:
    """(status, details) of a run, once it has finished (or what it was after ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    status = details = ""
    while True:
        res = subprocess.run([flwr(), "ls", *superlink, "--run-id", run_id, "--format",
                              "json"], capture_output=True, text=True, check=False)
        try:
            runs = json.loads(res.stdout).get("runs", [])
        except ValueError:
            runs = []
        if runs:
            status, details = str(runs[0].get("status", "")), str(
                runs[0].get("status-details", ""))
        if status.startswith("finished") or time.monotonic() >= deadline:
            return status, details
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtf.engines.flower.launch",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("superlink", nargs="?", help="SuperLink connection name (flwr's config)")
    p.add_argument("--run-config", "-c", action="append", default=[],
                   help="run config overrides, as for flwr run")
    p.add_argument("--app", default=str(APP_DIR), help="the Flower App folder")
    args = p.parse_args(argv)
    link = [args.superlink] if args.superlink else []
    cmd = [flwr(), "run", args.app, *link, "--stream"]
    for c in args.run_config:
        cmd += ["--run-config", c]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_id = None
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        m = re.search(r"started run (\d+)", line)
        run_id = run_id or (m.group(1) if m else None)
    rc = proc.wait()
    if run_id is None:
        print("mrtf: error: flwr run did not start a run (see its output above)",
              file=sys.stderr)
        return rc or 1
    status, details = run_status(link, run_id)
    if status == "finished:completed":
        return 0
    if MARK in details:
        print(MARK + details.split(MARK, 1)[1].strip(), file=sys.stderr)
        return 2
    print(f"mrtf: error: Flower run {run_id} ended {status or 'unknown'}: {details}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
