"""What the benchmark measures in each method's workspaces. Each figure is a list of samples
(seconds, or bytes for disk and memory) stored under results[corpus][method][figure]; the
report turns them into medians, ranges and ratios against the native checkout.

For octofs, every timed sample is bracketed by two reads of the mount's request counters
(`octofs stats <thread> --json`, outside the timing): results[corpus]["octofs"]["requests"][figure]
holds, per sample, the FUSE requests by opcode that the sample caused, so the report can say how
many requests per file stand behind a figure and which ones."""

import gc
import os
import random
import statistics
import subprocess
import time

from .common import (MIB, READ_CMD, STAT_CMD, BenchError, Skip, drop_caches, log, meminfo, out,
                     run, timed, timed_cmd, fmt_t, wait_quiet)
from .methods import Octo, process_rss

# (key, label, unit) in report order; unit "s" seconds, "B" bytes
FIGURES = [
    ("fork", "fork a workspace", "s"),
    ("disk", "new disk per fork", "B"),
    ("status_cold", "`git status`, first after the fork, caches dropped", "s"),
    ("status_warm", "`git status`, warm", "s"),
    ("stat", "stat every entry (`find -printf`), warm", "s"),
    ("read_fill", "read every file, caches dropped, blob cache empty (octofs: the project's first read on the host)", "s"),
    ("read_cold", "read every file, caches dropped", "s"),
    ("read", "read every file, warm", "s"),
    ("diff", "`git diff --stat` after 10 edits", "s"),
    ("checkout", "`git checkout` of the moved commit and back", "s"),
    ("snap1", "snapshot, 1 changed file", "s"),
    ("snap100", "snapshot, 100 changed files", "s"),
    ("snap1000", "snapshot, 1,000 changed files", "s"),
    ("build", "build", "s"),
    ("small", "create+write+delete small files", "s"),
    ("seq_write", "sequential write + fsync", "s"),
    ("seq_cold", "sequential read, caches dropped", "s"),
    ("seq_warm", "sequential read, warm", "s"),
    ("pagecache", "page cache after N workspaces read every file", "B"),
    ("pagecache_all", "page cache after N workspaces read every file (`Cached` + `Buffers`)", "B"),
    ("pagecache_files", "page cache the workspaces' files hold after N read every file (fincore)", "B"),
]
PAGECACHE_SETTLE = 3.0
CORPUS_FREE = ("small", "seq_write", "seq_cold", "seq_warm")
SNAP_KS = (1, 100, 1000)
SMALL_DIRS = 100


def status(path):
    return run(["git", "status", "--porcelain"], cwd=path).stdout


def tracked_regular(path, exclude):
    r = run(["git", "ls-files", "-s", "-z"], cwd=path)
    files = []
    for rec in r.stdout.split(b"\0"):
        if rec:
            meta, p = rec.split(b"\t", 1)
            p = p.decode(errors="surrogateescape")
            if meta.split()[0] == b"100644" and not p.startswith(exclude + "/") \
                    and not os.path.basename(p).startswith("."):
                files.append(p)
    return sorted(files)


def append(tree, paths, text):
    data = text.encode()
    for p in paths:
        with open(os.path.join(tree, p), "ab") as f:
            f.write(data)


class Runner:
    def __init__(self, ctx):
        self.ctx, self.args = ctx, ctx.args
        rng = random.Random(1234)
        self.pool = rng.randbytes(64 * 1024 + 4096)
        self.plan = [(i % SMALL_DIRS, f"f{i:05d}.dat", rng.randrange(0, 64 * 1024),
                      rng.randrange(1024, 4097)) for i in range(self.args.small_files)]
        self.seqbuf = bytes(random.Random(99).randbytes(MIB))

    @staticmethod
    def counted(m, fork, res, key, fn):
        """Runs fn (one timed sample of figure `key` in `fork`) and returns its result; for a
        method that counts its requests (octofs), records the requests by opcode the sample
        caused under res["requests"][key]."""
        before = m.requests(fork)
        if before is None:
            return fn()
        r = fn()
        after = m.requests(fork) or {}
        delta = {op: n - before.get(op, 0) for op, n in after.items() if n - before.get(op, 0) > 0}
        res.setdefault("requests", {}).setdefault(key, []).append(delta)
        return r

    def quiet(self):
        if self.args.quiet_wait:
            w = wait_quiet(self.args.quiet_wait)
            if w > 3:
                log(f"waited {w:.0f} s for a quiet machine")

    # --- the whole sequence for one method on one corpus ---------------------------------------

    def method(self, corpus, m, res, first_corpus):
        """Every figure of method m on the corpus. A failing stage is recorded in res["failed"]
        and the next stage runs; only a failing fork ends the method."""
        m.prepare(corpus)
        add = lambda k, v: res.setdefault(k, []).append(v)
        try:
            w = self.forks(m, res, add)
            stages = [("warm figures", lambda: self.warm(m, w, res, add)),
                      ("checkout", lambda: self.checkout(corpus, m, w, res, add)),
                      ("diff", lambda: self.diff(corpus, m, w, res, add)),
                      ("snapshots", lambda: self.snapshots(corpus, m, w, res, add))]
            if first_corpus:
                stages.append(("small files and sequential I/O",
                               lambda: self.io_figures(m, w, res, add)))
            if not (self.args.quick and corpus.name == "real"):     # --quick: one build, not two
                stages.append(("build", lambda: self.build(corpus, m, w, res, add)))
            for name, fn in stages:
                if self.args.stages and name.split()[0] not in self.args.stages:
                    continue
                try:
                    fn()
                except (BenchError, OSError, subprocess.SubprocessError) as e:
                    res.setdefault("failed", []).append(f"{name}: {e}")
                    log(f"  {m.name}: {name} failed: {e}")
            m.remove(w)
        finally:
            m.teardown()

    def fill_blobs(self, m, res, add):
        """octofs serves base content from a blob cache shared by every workspace of the host,
        written the first time a blob is read. The first read of the project, caches dropped,
        is timed here in a throwaway fork (figure read_fill), so that read_cold of every octofs
        method (which share one daemon) reads a filled cache, whichever runs first."""
        done = getattr(m.octo, "filled", set())
        m.octo.filled = done
        if m.project in done:
            return
        m.pre_fork()
        f = m.fork()
        try:
            drop_caches()
            add("read_fill", self.counted(m, f, res, "read_fill", lambda: timed_cmd(READ_CMD, f.path)))
            done.add(m.project)
            log(f"  {m.name}: first read of the project (blob cache filled) {fmt_t(res['read_fill'][-1])}")
        finally:
            m.remove(f)

    def forks(self, m, res, add):
        forks = []
        if isinstance(m, Octo) and (not self.args.stages or "pagecache" in self.args.stages):
            self.fill_blobs(m, res, add)
        for i in range(self.args.forks):
            m.pre_fork()
            os.sync()
            self.quiet()
            t, f = timed(m.fork)
            forks.append(f)
            add("fork", t)
            if m.requests(f) is not None:      # a new mount: every request so far is the fork's
                res.setdefault("requests", {}).setdefault("fork", []).append(m.requests(f))
            add("disk", m.new_bytes(f))
            drop_caches()
            t, st = self.counted(m, f, res, "status_cold", lambda: timed(lambda: status(f.path)))
            add("status_cold", t)
            if st.strip():
                raise BenchError(f"a new fork is not clean: `git status` lists "
                                 f"{len(st.splitlines())} paths, e.g. {st.splitlines()[0]!r}")
            log(f"  {m.name}: fork {i + 1} {fmt_t(res['fork'][-1])}, "
                f"{res['disk'][-1] / MIB:.1f} MiB, first status {fmt_t(t)}")
        if self.args.stages and "pagecache" not in self.args.stages:
            for f in forks[:-1]:
                m.remove(f)
            return forks[-1]
        # N workspaces read every file, caches dropped: the page cache they use
        drop_caches()
        c0, b0 = meminfo("Cached"), meminfo("Buffers")
        for i, f in enumerate(forks):
            if i == 0:
                add("read_cold", self.counted(m, f, res, "read_cold",
                                              lambda: timed_cmd(READ_CMD, f.path)))
            else:
                timed_cmd(READ_CMD, f.path)
        # Every method gets the same 3 s to settle: no-open's read-ahead drops the blob-cache
        # pages it warmed 2 s after warming them (`AHEAD_DROP_AFTER`), a transient copy.
        time.sleep(PAGECACHE_SETTLE)
        c1, b1 = meminfo("Cached"), meminfo("Buffers")
        add("pagecache", c1 - c0)
        add("pagecache_all", c1 + b1 - c0 - b0)
        res["pagecache_n"] = len(forks)
        held = m.resident(forks)
        if held is not None:
            add("pagecache_files", held)
        for f in forks[:-1]:
            m.remove(f)
        return forks[-1]

    def warm(self, m, w, res, add):
        runs = self.args.runs
        status(w.path)
        for _ in range(runs):
            add("status_warm", self.counted(m, w, res, "status_warm",
                                            lambda: timed(lambda: status(w.path))[0]))
        timed_cmd(STAT_CMD, w.path)
        for _ in range(runs):
            add("stat", self.counted(m, w, res, "stat", lambda: timed_cmd(STAT_CMD, w.path)))
        timed_cmd(READ_CMD, w.path)
        for _ in range(runs):
            add("read", self.counted(m, w, res, "read", lambda: timed_cmd(READ_CMD, w.path)))
        log(f"  {m.name}: status warm {fmt_t(res['status_warm'][-1])}, stat {fmt_t(res['stat'][-1])}, "
            f"read {fmt_t(res['read'][-1])}")

    def checkout(self, corpus, m, w, res, add):
        """The moved commit and back, HEAD detached at both ends."""
        def both_ways():
            t0 = time.perf_counter()
            run(["git", "checkout", "-q", "--detach", corpus.other], cwd=w.path)
            run(["git", "checkout", "-q", "--detach", corpus.base], cwd=w.path)
            return time.perf_counter() - t0
        for _ in range(self.args.slow_runs):
            self.quiet()
            add("checkout", self.counted(m, w, res, "checkout", both_ways))
        head = out(run(["git", "rev-parse", "HEAD"], cwd=w.path))
        left = status(w.path).decode(errors="replace").splitlines()
        if head != corpus.base or left:
            raise BenchError(f"after checking out the moved commit and back, HEAD is {head[:12]} and "
                             f"`git status` lists {len(left)} paths, e.g. {left[:1]}")

    def sample(self, corpus, w):
        files = tracked_regular(w.path, corpus.build.subdir)
        return random.Random(5).sample(files, min(len(files), max(SNAP_KS)))

    def diff(self, corpus, m, w, res, add):
        sample = self.sample(corpus, w)
        ten = sample[::max(1, len(sample) // 10)][:10]
        try:
            for k in range(self.args.runs):
                append(w.path, ten, f"bench edit {k}\n")
                t, r = self.counted(m, w, res, "diff",
                                    lambda: timed(lambda: run(["git", "diff", "--stat"], cwd=w.path)))
                add("diff", t)
                if f"{len(ten)} files changed" not in r.stdout.decode():
                    raise BenchError(f"`git diff --stat` after {len(ten)} edits says: "
                                     f"{r.stdout.decode().strip().splitlines()[-1:]}")
        finally:
            run(["git", "checkout", "-q", "--"] + ten, cwd=w.path)

    def snapshots(self, corpus, m, w, res, add):
        sample = self.sample(corpus, w)
        try:
            for k in range(self.args.slow_runs):
                for n in SNAP_KS:
                    append(w.path, sample[:n], f"snapshot run {k} size {n}\n")
                    add(f"snap{n}", self.counted(m, w, res, f"snap{n}", lambda: m.snapshot(w, n)))
            log(f"  {m.name}: " + ", ".join(f"snapshot {n} {fmt_t(res[f'snap{n}'][-1])}" for n in SNAP_KS))
        finally:
            run(["git", "checkout", "-q", "--"] + sample, cwd=w.path)

    # --- corpus-independent I/O ---------------------------------------------------------------

    def io_figures(self, m, w, res, add):
        for _ in range(self.args.slow_runs):
            self.quiet()
            c, d = self.counted(m, w, res, "small", lambda: self.small(w.path))
            add("small", c + d)
        for _ in range(self.args.slow_runs):
            self.quiet()
            # One count for the write and the reads of a run (they are one call).
            for k, v in self.counted(m, w, res, "seq", lambda: self.seq(w.path)).items():
                add(k, v)

    def small(self, root):
        top = os.path.join(root, "bench-small")
        dirs = [os.path.join(top, f"d{d:03d}") for d in range(SMALL_DIRS)]
        paths = [os.path.join(dirs[d], name) for d, name, _, _ in self.plan]
        pool = memoryview(self.pool)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        os.sync()
        gc.disable()
        try:
            t0 = time.perf_counter()
            os.mkdir(top)
            for d in dirs:
                os.mkdir(d)
            for p, (_, _, off, size) in zip(paths, self.plan):
                fd = os.open(p, flags, 0o644)
                try:
                    os.write(fd, pool[off:off + size])
                finally:
                    os.close(fd)
            t1 = time.perf_counter()
            for k in range(0, len(paths), max(1, len(paths) // 20)):
                _, _, off, size = self.plan[k]
                with open(paths[k], "rb") as f:
                    if f.read() != self.pool[off:off + size]:
                        raise BenchError(f"{paths[k]}: content read back differs")
            t2 = time.perf_counter()
            for p in paths:
                os.unlink(p)
            for d in dirs:
                os.rmdir(d)
            os.rmdir(top)
            t3 = time.perf_counter()
        finally:
            gc.enable()
        return t1 - t0, t3 - t2

    def seq(self, root):
        path = os.path.join(root, "bench-seq.bin")
        n = self.args.seq_mib
        os.sync()
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for _ in range(n):
                mv = memoryview(self.seqbuf)
                while mv:
                    mv = mv[os.write(fd, mv):]
            os.fsync(fd)
        finally:
            os.close(fd)
        res = {"seq_write": time.perf_counter() - t0}
        drop_caches()
        res["seq_cold"] = self.read_all(path, n)
        res["seq_warm"] = statistics.median(self.read_all(path, n) for _ in range(3))
        os.unlink(path)
        return res

    @staticmethod
    def read_all(path, nmib):
        buf = bytearray(MIB)
        total = 0
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while True:
                r = os.readv(fd, [buf])
                if not r:
                    break
                total += r
        finally:
            os.close(fd)
        if total != nmib * MIB:
            raise BenchError(f"read {total} bytes of {path}, expected {nmib * MIB}")
        return time.perf_counter() - t0

    # --- the build ------------------------------------------------------------------------------

    def build(self, corpus, m, w, res, add):
        b = corpus.build
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        env["LC_ALL"] = "C"
        tree = os.path.join(w.path, b.subdir)
        for _ in range(self.args.build_runs):
            run(["git", "clean", "-fdxq", "--", "."], cwd=tree)
            os.sync()
            self.quiet()
            t, r = self.counted(m, w, res, "build", lambda: timed(
                lambda: subprocess.run(b.cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)))
            if r.returncode:
                tail = r.stderr.decode(errors="replace").strip().splitlines()[-2:]
                raise BenchError(f"build failed (exit {r.returncode}): {' / '.join(tail)}")
            run(b.check, cwd=w.path, env=env)
            add("build", t)
            log(f"  build {fmt_t(t)}")
        run(["git", "clean", "-fdxq", "--", "."], cwd=tree)


# --- memory of the FUSE daemons with 1, 10, 100 workspaces -----------------------------------------

def daemon_memory(ctx, corpus, methods, counts):
    """RSS of octofs's one daemon and of fuse-overlayfs's daemons with k workspaces mounted, and
    after a `git status` in each of the first 10. Returns {method: {label: bytes}}."""
    outp = {}
    for m in methods:
        if m.processes is None:
            continue
        try:
            m.prepare(corpus)
        except Skip as e:
            outp[m.name] = {"skipped": str(e)}
            continue
        vals = {}
        forks = []
        try:
            if isinstance(m, Octo):
                m.copy_deps = lambda dst: None
            base = process_rss(m.processes())
            vals["0"] = base
            for k in counts:
                while len(forks) < k:
                    forks.append(m.fork())
                time.sleep(0.5)
                vals[str(k)] = process_rss(m.processes())
            for f in forks[:10]:
                status(f.path)
            vals["10+status"] = process_rss(m.processes())
            log(f"  memory {m.name}: " + ", ".join(f"{k}: {v / MIB:.1f} MiB" for k, v in vals.items()))
        finally:
            for f in forks:
                m.remove(f)
            m.teardown()
        outp[m.name] = vals
    return outp
