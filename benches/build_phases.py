"""Where the first build of the seed GEMM in a process spends its time, phase by phase.

Runs P fresh processes (default 15) with RIVET_BUILD_TIMES=1, each building the unscheduled
GEMM of `build_time.py` once (or, with --repeat, twice: the second build's phases), and
prints the median wall and thread CPU time of each phase (phases that run several times in
a build, like the verifier, summed per build). The CPU column is what to read on a loaded
machine.
Run: .venv/bin/python benches/build_phases.py [P] [--repeat]
"""

import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"^rivet: build time: ( *)(.*) ([0-9.]+) ms wall ([0-9.]+) ms cpu$")

CHILD = """
import sys
sys.path.insert(0, {bench!r})
import build_time, rivet
for _ in range({builds}):
    s, a = build_time.program(False)
    print("rivet: build start", file=sys.stderr, flush=True)
    rivet.build(s, a, target="cpu", name="mm")
"""


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    repeat = "--repeat" in sys.argv
    procs = int(args[0]) if args else 15
    env = dict(os.environ, RIVET_BUILD_TIMES="1", RIVET_BUILD_CACHE="0", RIVET_CACHE_DIR="off")
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), builds=2 if repeat else 1)
    order, runs = [], []
    for _ in range(procs):
        err = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stderr
        build = err.split("rivet: build start")[-1]
        sums = {}
        for line in build.splitlines():
            m = LINE.match(line)
            if not m:
                continue
            key = (len(m.group(1)) // 2, m.group(2))
            if key not in sums:
                sums[key] = [0.0, 0.0]
                if key not in order:
                    order.append(key)
            sums[key][0] += float(m.group(3))
            sums[key][1] += float(m.group(4))
        runs.append(sums)
    which = "second" if repeat else "first"
    print(f"{which} build of the seed GEMM, median over {procs} processes (ms)")
    print(f"{'phase':48} {'wall':>8} {'cpu':>8}")
    for key in order:
        walls = [r[key][0] for r in runs if key in r]
        cpus = [r[key][1] for r in runs if key in r]
        name = "  " * key[0] + key[1]
        print(f"{name:48} {statistics.median(walls):8.3f} {statistics.median(cpus):8.3f}")


if __name__ == "__main__":
    main()
