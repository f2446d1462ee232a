#!/usr/bin/env python3
"""A checkpoint pair larger than the process's memory limit diffs, applies and verifies.

usage: bigmem_test.py DCR MAKE_BIG_PAIR [--mib N] [--limit-mib L] [--bound-mib B] [--dir D]

Writes a base and a target of N MiB each (make_big_pair), then runs the real `dcr diff`, `dcr
apply` and `dcr verify` binaries, and a `dd` read of the target as the speed reference, each in a
fresh memory cgroup limited to L MiB (L < N: a run that read a checkpoint into anonymous memory is
killed; the page cache of the mapped files is reclaimable under the limit). Every file is dropped
from the page cache before each step, so each step reads from disk. Checks that each step
succeeds, that apply's output is byte-identical to the target (cmp), and that the cgroup's peak
anonymous memory, sampled every few milliseconds, stays under B MiB. Prints each step's seconds,
its ratio to the dd read and its peak anonymous memory.

The cgroup: cgroup v2 when a writable unified hierarchy has the memory controller, else cgroup
v1's memory controller; with neither (not root, no controller, read-only) the test prints why
and exits 77 (CTest's SKIP_RETURN_CODE), never a silent pass.
"""
import argparse
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77


def mounts():
    with open("/proc/mounts") as f:
        for line in f:
            dev, path, fstype, opts = line.split()[:4]
            yield path, fstype, opts.split(",")


class Cgroup:
    """A memory cgroup of `limit` bytes; `kind` is "v2" or "v1"."""

    def __init__(self, path, kind, limit):
        self.path, self.kind, self.limit = path, kind, limit

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def anon_bytes(self):
        key = "anon" if self.kind == "v2" else "rss"
        for line in self.read("memory.stat").splitlines():
            k, v = line.split()
            if k == key:
                return int(v)
        return 0

    def oom_kills(self):
        name = "memory.events" if self.kind == "v2" else "memory.oom_control"
        try:
            for line in self.read(name).splitlines():
                k, v = line.split()
                if k == "oom_kill":
                    return int(v)
        except OSError:
            pass
        return 0

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def make_cgroup(name, limit):
    """Returns (Cgroup, None) or (None, the reasons neither hierarchy could be used)."""
    reasons = []
    if os.geteuid() != 0:
        return None, ["not root: creating a memory cgroup needs root"]
    for path, fstype, _ in mounts():
        if fstype != "cgroup2":
            continue
        try:
            with open(os.path.join(path, "cgroup.controllers")) as f:
                controllers = f.read().split()
        except OSError as e:
            reasons.append("cgroup v2 at %s: %s" % (path, e))
            continue
        if "memory" not in controllers:
            reasons.append("cgroup v2 at %s: no memory controller (it is bound to v1)" % path)
            continue
        try:
            with open(os.path.join(path, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if "memory" not in enabled:
                with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            cg = Cgroup(os.path.join(path, name), "v2", limit)
            os.mkdir(cg.path)
            try:
                cg.write("memory.max", limit)
                if os.path.exists(os.path.join(cg.path, "memory.swap.max")):
                    cg.write("memory.swap.max", 0)
            except OSError:
                cg.remove()
                raise
            return cg, None
        except OSError as e:
            reasons.append("cgroup v2 at %s: %s" % (path, e))
    for path, fstype, opts in mounts():
        if fstype != "cgroup" or "memory" not in opts:
            continue
        try:
            cg = Cgroup(os.path.join(path, name), "v1", limit)
            os.mkdir(cg.path)
            try:
                cg.write("memory.limit_in_bytes", limit)
                if os.path.exists(os.path.join(cg.path, "memory.memsw.limit_in_bytes")):
                    cg.write("memory.memsw.limit_in_bytes", limit)
            except OSError:
                cg.remove()
                raise
            return cg, None
        except OSError as e:
            reasons.append("cgroup v1 memory at %s: %s" % (path, e))
    if not reasons:
        reasons.append("no cgroup v2 or cgroup v1 memory hierarchy is mounted")
    return None, reasons


def drop_cache(paths):
    for p in paths:
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_limited(label, argv, limit, files, log):
    """Runs argv in a fresh cgroup of `limit` bytes; returns (rc, seconds, peak anon bytes, oom)."""
    cg, reasons = make_cgroup("dcr-bigmem-%d-%s" % (os.getpid(), label), limit)
    if cg is None:
        print("SKIP: no usable memory cgroup:\n  " + "\n  ".join(reasons))
        sys.exit(SKIP)
    drop_cache(files)
    procs = os.path.join(cg.path, "cgroup.procs")

    def enter():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], cg.anon_bytes())
            except OSError:
                pass
            time.sleep(0.003)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.monotonic()
    try:
        with open(log, "w") as out:
            p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=enter)
        secs = time.monotonic() - t0
    finally:
        done.set()
        sampler.join()
    peak[0] = max(peak[0], cg.anon_bytes())
    oom = cg.oom_kills()
    cg.remove()
    return p.returncode, secs, peak[0], oom


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dcr")
    ap.add_argument("make_big_pair")
    ap.add_argument("--mib", type=int, default=1536, help="size of each checkpoint")
    ap.add_argument("--limit-mib", type=int, default=768, help="memory cgroup limit")
    ap.add_argument("--bound-mib", type=int, default=640, help="allowed peak anonymous memory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a fresh one in /var/tmp)")
    a = ap.parse_args()
    if a.limit_mib >= a.mib:
        print("FAIL: the limit (%d MiB) must be below the checkpoint size (%d MiB)" % (a.limit_mib, a.mib))
        return 1
    limit = a.limit_mib << 20
    # Skip before writing gigabytes when no cgroup can be made.
    cg, reasons = make_cgroup("dcr-bigmem-%d-probe" % os.getpid(), limit)
    if cg is None:
        print("SKIP: no usable memory cgroup:\n  " + "\n  ".join(reasons))
        return SKIP
    print("memory cgroup %s (%s), limit %d MiB" % (cg.path, cg.kind, a.limit_mib))
    cg.remove()
    work = tempfile.mkdtemp(prefix="dcr-bigmem-", dir=a.dir or "/var/tmp")
    need = 4 * (a.mib << 20) + (a.mib << 20) // 4
    free = shutil.disk_usage(work).free
    if free < need:
        shutil.rmtree(work, ignore_errors=True)
        print("SKIP: %s has %d MiB free; the pair, its delta and the output need %d MiB"
              % (work, free >> 20, need >> 20))
        return SKIP
    base, target = os.path.join(work, "base.safetensors"), os.path.join(work, "target.safetensors")
    delta, out = os.path.join(work, "d.dcr"), os.path.join(work, "out.safetensors")
    files = [base, target, delta, out]
    fail = 0
    try:
        g = subprocess.run([a.make_big_pair, base, target, "--mib", str(a.mib)],
                           stdout=subprocess.PIPE, text=True)
        print(g.stdout.strip())
        if g.returncode != 0:
            print("FAIL make_big_pair: exit %d" % g.returncode)
            return 1
        t = str(a.threads)
        # dd's sink: a character device that discards writes (/dev/null, else /dev/zero: a
        # /dev/null that is a regular file on a tmpfs would keep the bytes in memory).
        sink = next((d for d in ("/dev/null", "/dev/zero") if stat.S_ISCHR(os.stat(d).st_mode)), None)
        if sink is None:
            print("FAIL: neither /dev/null nor /dev/zero is a character device")
            return 1
        steps = [
            ("dd", ["dd", "if=" + target, "of=" + sink, "bs=8M"]),
            ("diff", [a.dcr, "diff", base, target, "-o", delta, "--threads", t]),
            ("apply", [a.dcr, "apply", base, delta, "-o", out, "--threads", t]),
            ("verify", [a.dcr, "verify", out, target]),
        ]
        times = {}
        for label, argv in steps:
            log = os.path.join(work, label + ".log")
            rc, secs, peak, oom = run_limited(label, argv, limit, files, log)
            with open(log) as f:
                text = f.read().strip()
            times[label] = secs
            ratio = secs / times["dd"] if times.get("dd") else 1.0
            print("%-6s rc=%d  %6.2f s  %5.2fx the dd read  peak anon %6.1f MiB%s"
                  % (label, rc, secs, ratio, peak / 2**20,
                     "  (OOM-killed %d)" % oom if oom else ""))
            if label != "dd":
                for line in text.splitlines()[-3:]:
                    print("       | " + line)
            if rc != 0:
                print("FAIL %s: exit %d%s\n%s" % (label, rc,
                      " (killed by signal %d)" % -rc if rc < 0 else "", text))
                fail = 1
                break
            if label != "dd" and peak > a.bound_mib << 20:
                print("FAIL %s: peak anonymous memory %.1f MiB over the %d MiB bound"
                      % (label, peak / 2**20, a.bound_mib))
                fail = 1
        if not fail:
            c = subprocess.run(["cmp", out, target])
            if c.returncode != 0:
                print("FAIL cmp: apply's output differs from the target")
                fail = 1
            else:
                print("ok   cmp: apply's output is byte-identical to the target")
        size = os.path.getsize(target)
        if "dd" in times:
            print("dd read of the %d MiB target: %.0f MB/s" % (size >> 20, size / times["dd"] / 1e6))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("FAIL" if fail else "PASS")
    return fail


if __name__ == "__main__":
    sys.exit(main())
