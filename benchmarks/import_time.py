"""Start-up cost: `import shardrules` against `import jax`, in fresh processes.

    python benchmarks/import_time.py [--repeat 15] [--python PATH] [--top 15]

Each variant is a fresh `python` process, timed from start to exit (wall
clock) and by the CPU time it used; the variants take turns over `--repeat`
rounds and each keeps its best round (the machine may be shared: the best
round is the one least disturbed). Measured:

- `python -c pass`: the interpreter alone;
- `import jax`: the floor, what any JAX program pays;
- `import shardrules`: the package with every public name (it imports JAX);
- `python -m shardrules --help` and `shardrules lint` of one rule file (no
  devices, no arrays): the command line's start-up.

Each is shown with its ratio to `import jax` from the same run. With `--top`,
the modules `import shardrules` loads beyond `import jax` that take longest
(self time, from one `python -X importtime` run): where to look when the
ratio grows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "benchmarks" / "rules" / "transformer_fsdp.shard"

VARIANTS: list[tuple[str, list[str]]] = [
    ("python -c pass", ["-c", "pass"]),
    ("import jax", ["-c", "import jax"]),
    ("import shardrules", ["-c", "import shardrules"]),
    ("python -m shardrules --help", ["-m", "shardrules", "--help"]),
    ("shardrules lint (one file)", ["-m", "shardrules", "lint", str(RULES)]),
]
FLOOR = "import jax"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"  # no accelerator probing: the same work on every machine
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # timed with bytecode cached, as once installed
    return env


def run_once(python: str, argv: list[str]) -> tuple[float, float]:
    """`python argv` (which must exit with 0): seconds from its start to its
    exit, and the CPU seconds it used (user and system, all its threads: what
    other work on a shared machine disturbs least)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, *argv], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def versions(python: str) -> dict[str, str]:
    probe = (
        "import json, platform, jax, lark, shardrules; "
        "print(json.dumps({'python': platform.python_version(), 'jax': jax.__version__, "
        "'lark': lark.__version__, 'shardrules': shardrules.__version__}))"
    )
    out = subprocess.run(
        [python, "-c", probe], cwd=REPO, env=_env(), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def importtime(python: str, code: str) -> dict[str, tuple[int, int]]:
    """Module → (self µs, cumulative µs), from one `python -X importtime -c code`."""
    proc = subprocess.run(
        [python, "-X", "importtime", "-c", code],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, tuple[int, int]] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, total, name = line.removeprefix("import time:").split("|")
        found[name.strip()] = (int(own), int(total))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds; each variant keeps its best")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    parser.add_argument(
        "--top", type=int, default=0, help="list the N slowest modules shardrules adds to jax"
    )
    args = parser.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}")
    v = versions(args.python)
    print(f"python {v['python']}, jax {v['jax']}, lark {v['lark']}, shardrules {v['shardrules']}")
    print(f"best of {args.repeat} fresh processes each, variants in turn\n")

    for _, argv in VARIANTS:  # warm the file system cache and the bytecode
        run_once(args.python, argv)
    wall: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    cpu: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    for _ in range(args.repeat):
        for label, argv in VARIANTS:
            seconds, cpu_seconds = run_once(args.python, argv)
            wall[label].append(seconds)
            cpu[label].append(cpu_seconds)

    print(f"  {'':30}{'wall ms':>9}{'vs jax':>8}{'+ms':>7}{'CPU ms':>9}{'vs jax':>8}{'+ms':>7}")
    floor_wall, floor_cpu = min(wall[FLOOR]), min(cpu[FLOOR])
    for label, _ in VARIANTS:
        row = ""
        for seconds, floor in ((min(wall[label]), floor_wall), (min(cpu[label]), floor_cpu)):
            row += f"{seconds * 1e3:9.0f}{seconds / floor:7.2f}x{(seconds - floor) * 1e3:+7.0f}"
        print(f"  {label:30}{row}")

    if args.top:
        jax_only = importtime(args.python, "import jax")
        ours = importtime(args.python, "import shardrules")
        added = {m: t for m, t in ours.items() if m not in jax_only}
        total = sum(own for own, _ in added.values())
        print(f"\nmodules `import shardrules` adds to `import jax`: {len(added)}, {total / 1e3:.0f} ms self")
        print(f"  {'self ms':>8}{'cumul ms':>10}  module")
        for name, (own, cumulative) in sorted(added.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"  {own / 1e3:8.1f}{cumulative / 1e3:10.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
