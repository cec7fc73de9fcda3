"""The ways a user can get a private workspace of a repository, each behind the same interface:
prepare for a corpus, fork (timed), count the fork's new disk bytes, remove, tear down. A method
whose tool is missing or cannot work here raises `Skip` with the reason.

Every fork starts from the corpus's template checkout (with its ignored dependency trees); where
the method itself cannot carry ignored files (clone, worktree, octofs), they are copied in with
`cp -a` as part of the fork, as a user would have to."""

import json
import os
import shutil
import time

from .common import (MIB, BenchError, Skip, disk_bytes, fs_used, inodes_of, log, mounts_under,
                     out, pids_of_exe, resident_bytes, rss, run, unmount)


class Fork:
    def __init__(self, path, **kw):
        self.path = path
        self.__dict__.update(kw)


class Method:
    name = "?"

    def requests(self, fork):
        """FUSE requests answered for the fork so far, by opcode: only octofs counts them."""
        return None

    label = "?"
    desc = ""
    processes = None      # None: no process of its own (kernel or none)

    def __init__(self, ctx):
        self.ctx = ctx             # the run: work dir, octofs daemon, args
        self.corpus = None
        self.dir = None
        self.n = 0
        self.before = None         # a disk baseline taken by pre_fork, where a method needs one

    def prepare(self, corpus):
        self.corpus = corpus
        self.dir = os.path.join(self.ctx.work, f"{corpus.name}-{self.name}")
        os.makedirs(self.dir, exist_ok=True)

    def next_path(self):
        self.n += 1
        return os.path.join(self.dir, f"ws{self.n}")

    def copy_deps(self, dst, only=None):
        for d in (self.corpus.deps if only is None else only):
            run(["cp", "-a", os.path.join(self.corpus.repo, d), os.path.join(dst, d)])

    def resident(self, forks):
        """Page cache the files of `forks` hold (their own files: a copy each)."""
        return resident_bytes([f.path for f in forks])

    def pre_fork(self):
        """Untimed work before a timed fork (a baseline of the disk usage)."""

    def fork(self):
        raise NotImplementedError

    def new_bytes(self, fork):
        return disk_bytes(fork.path)

    def remove(self, fork):
        shutil.rmtree(fork.path, ignore_errors=True)

    def teardown(self):
        for mp in mounts_under(self.dir) if self.dir else []:
            unmount(mp)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def snapshot(self, fork, k):
        """The seed's scratch-index snapshot: copy the index, `add -A`, write-tree, commit-tree
        with HEAD as parent, push to the mirror. Returns seconds."""
        scratch = os.path.join(self.ctx.work, "scratch-index")
        idx = out(run(["git", "rev-parse", "--git-path", "index"], cwd=fork.path))
        t0 = time.perf_counter()
        shutil.copyfile(os.path.join(fork.path, idx), scratch)
        env = dict(self.ctx.genv, GIT_INDEX_FILE=scratch)
        run(["git", "add", "-A"], cwd=fork.path, env=env)
        tree = out(run(["git", "write-tree"], cwd=fork.path, env=env))
        commit = out(run(["git", "commit-tree", tree, "-p", "HEAD", "-m", f"snapshot {k}"],
                         cwd=fork.path))
        run(["git", "push", "-q", "--no-verify", self.ctx.seed_mirror(self.corpus),
             f"+{commit}:refs/octomate/threads/{self.name}-{self.n}"], cwd=fork.path)
        t = time.perf_counter() - t0
        os.unlink(scratch)
        return t


class Native(Method):
    name, label = "native", "native checkout"
    desc = "`git clone --no-local` of the repository + `cp -a` of the ignored dependencies (the 1.0 reference)"

    def fork(self):
        p = self.next_path()
        run(["git", "clone", "-q", "--no-local", self.corpus.repo, p])
        self.copy_deps(p)
        return Fork(p)


class CloneLocal(Method):
    name, label = "clone", "git clone --local"
    desc = "`git clone --local` (objects hard-linked) + `cp -a` of the ignored dependencies"

    def prepare(self, corpus):
        super().prepare(corpus)
        self.template_inodes = inodes_of(os.path.join(corpus.repo, ".git"))

    def fork(self):
        p = self.next_path()
        run(["git", "clone", "-q", "--local", self.corpus.repo, p])
        self.copy_deps(p)
        return Fork(p)

    def new_bytes(self, fork):
        return disk_bytes(fork.path, seen=set(self.template_inodes))


class Worktree(Method):
    name, label = "worktree", "git worktree add"
    desc = "`git worktree add --detach` of the template's repository + `cp -a` of the ignored dependencies"

    def fork(self):
        p = self.next_path()
        run(["git", "-C", self.corpus.repo, "worktree", "add", "-q", "--detach", p, "main"])
        self.copy_deps(p)
        meta = os.path.join(self.corpus.repo, ".git", "worktrees", os.path.basename(p))
        return Fork(p, meta=meta)

    def new_bytes(self, fork):
        return disk_bytes(fork.path) + disk_bytes(fork.meta)

    def remove(self, fork):
        run(["git", "-C", self.corpus.repo, "worktree", "remove", "--force", fork.path], check=False)
        super().remove(fork)

    def teardown(self):
        super().teardown()
        if self.corpus:
            run(["git", "-C", self.corpus.repo, "worktree", "prune"], check=False)


class Copy(Method):
    name, label = "cp", "cp -a"
    desc = "`cp -a` of the whole checkout, dependencies included (ext4 here: no reflink)"

    def fork(self):
        p = self.next_path()
        run(["cp", "-a", self.corpus.repo, p])
        return Fork(p)


class Reflink(Method):
    name, label = "reflink", "cp --reflink (XFS)"
    desc = ("`cp -a --reflink=always` on an XFS file system (loop device, `mkfs.xfs -m reflink=1`) "
            "holding a copy of the checkout; new disk = the XFS file system's used-bytes change")

    def prepare(self, corpus):
        super().prepare(corpus)
        if not shutil.which("mkfs.xfs"):
            raise Skip("mkfs.xfs not found (xfsprogs could not be installed)")
        if not shutil.which("losetup"):
            raise Skip("losetup not found")
        size = disk_bytes(corpus.repo)
        img = os.path.join(self.dir, "xfs.img")
        self.mnt = os.path.join(self.dir, "xfs")
        os.makedirs(self.mnt)
        with open(img, "wb") as f:
            f.truncate(max(8 * 1024 * MIB, 3 * size + self.ctx.args.seq_mib * MIB * 2 + 2048 * MIB))
        r = run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", img], check=False)
        if r.returncode:
            raise Skip(f"mkfs.xfs failed: {r.stderr.decode(errors='replace').strip()[:200]}")
        r = run(["mount", "-o", "loop", img, self.mnt], check=False)
        if r.returncode:
            raise Skip(f"cannot mount an XFS loop device: {r.stderr.decode(errors='replace').strip()[:200]}")
        self.template = os.path.join(self.mnt, "template")
        log("reflink: copying the checkout onto XFS (once, not timed)")
        run(["cp", "-a", corpus.repo, self.template])

    def pre_fork(self):
        self.before = fs_used(self.mnt)

    def fork(self):
        self.n += 1
        p = os.path.join(self.mnt, f"ws{self.n}")
        run(["cp", "-a", "--reflink=always", self.template, p])
        return Fork(p, before=self.before)

    def new_bytes(self, fork):
        return fs_used(self.mnt) - fork.before


class Overlay(Method):
    name, label = "overlay", "kernel overlayfs"
    desc = "kernel overlayfs: the checkout as lower directory, a new upper and work directory per fork"
    fstype = "overlay"

    def prepare(self, corpus):
        super().prepare(corpus)
        self.check_tool()

    def check_tool(self):
        with open("/proc/filesystems") as f:
            if "overlay" not in f.read():
                r = run(["modprobe", "overlay"], check=False)
                if r.returncode:
                    raise Skip("the kernel has no overlay file system")

    def mount(self, lower, upper, work, merged):
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={upper},workdir={work}", merged])

    def fork(self):
        self.n += 1
        base = os.path.join(self.dir, f"ws{self.n}")
        up, wk, mp = (os.path.join(base, x) for x in ("upper", "work", "merged"))
        for d in (up, wk, mp):
            os.makedirs(d)
        self.mount(self.corpus.repo, up, wk, mp)
        return Fork(mp, base=base, upper=up, workdir=wk)

    def new_bytes(self, fork):
        return disk_bytes(fork.upper) + disk_bytes(fork.workdir)

    def remove(self, fork):
        unmount(fork.path)
        shutil.rmtree(fork.base, ignore_errors=True)


class FuseOverlay(Overlay):
    name, label = "fuse-overlayfs", "fuse-overlayfs"
    desc = "fuse-overlayfs (one FUSE daemon per mount): the checkout as lower directory"

    def check_tool(self):
        self.bin = shutil.which("fuse-overlayfs")
        if not self.bin:
            raise Skip("fuse-overlayfs not found (the package could not be installed)")
        if not os.path.exists("/dev/fuse"):
            raise Skip("/dev/fuse does not exist")

    def mount(self, lower, upper, work, merged):
        run([self.bin, "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", merged])
        deadline = time.monotonic() + 10
        while not os.path.ismount(merged):
            if time.monotonic() > deadline:
                raise BenchError(f"fuse-overlayfs did not mount {merged}")
            time.sleep(0.01)

    def processes(self):
        return pids_of_exe(self.bin)


class Octo(Method):
    """octofs as a user gets it: the daemon's default transport (`serve --transport auto`: FUSE
    over io_uring where the kernel offers it) and I/O mode (`serve --io auto`: each thread no-open
    while the bases fit in half the memory and a base has fewer no-open mounts than CPUs, else
    handles), nothing asked."""
    name, label = "octofs", "octofs (default)"
    desc = ("`octofs open` of the repository's mirror (a private daemon and state, its default "
            "configuration: `--transport auto` serves it over io_uring where the kernel offers it, "
            "`--io auto` chooses no-open or handles per thread), its ignored "
            "dependencies presented by the project's dependency layer (built once at `mirror add`; "
            "`cp -a` into the mount only when no layer was built); snapshots with `octofs snapshot`")

    daemon_key = "main"
    daemon_env = {}       # the daemon's own environment on top of the run's (e.g. its transport)
    io = None             # the thread's I/O mode (`octofs open --io`); None: the daemon's default
    tag = ""              # in thread names, so that methods sharing a daemon never share a thread

    def prepare(self, corpus):
        super().prepare(corpus)
        if not os.path.exists("/dev/fuse"):
            raise Skip("/dev/fuse does not exist")
        self.octo = self.ctx.octofs(self.daemon_key, self.daemon_env)
        self.project = f"bench-{corpus.name}"
        if self.project not in self.octo.mirrored:
            t0 = time.perf_counter()
            self.octo.call("mirror", "add", self.project, corpus.repo, timeout=7200)
            log(f"  octofs: mirror add {time.perf_counter() - t0:.1f} s")
            self.octo.mirrored.add(self.project)

    def resident(self, forks):
        """Page cache of the daemon's blob cache (with passthrough the mounts read it, their own
        page cache stays empty; mapping a file through the mount would count the blob again),
        plus each no-open mount's own (`status` says which mode auto chose)."""
        blobs = resident_bytes([os.path.join(self.octo.state, "blobs")])
        no_open = [f.path for f in forks if self.octo.status(f.thread).get("io") == "no-open"]
        if not no_open or blobs is None:
            return blobs
        mounts = resident_bytes(no_open)
        return None if mounts is None else blobs + mounts

    def state_bytes(self):
        """Bytes under the state directory but its mirrors (which a fork never writes)."""
        st = self.octo.state
        return disk_bytes(*[os.path.join(st, e) for e in sorted(os.listdir(st)) if e != "mirrors"])

    def pre_fork(self):
        self.before = self.state_bytes()

    def fork(self):
        self.n += 1
        thread = f"{self.corpus.name}-{self.daemon_key}{self.tag}-{self.n}"
        p = self.octo.open(thread, self.project, io=self.io)
        # A dependency layer presents them already; without one (no lockfile, a failed build)
        # they are copied in as a user would have to.
        missing = [d for d in self.corpus.deps if not os.path.isdir(os.path.join(p, d))]
        if missing:
            self.copy_deps(p, only=missing)
        return Fork(p, thread=thread, before=self.before)

    def new_bytes(self, fork):
        return self.state_bytes() - fork.before

    def remove(self, fork):
        self.octo.call("release", fork.thread, "--force", check=False)

    def teardown(self):
        pass

    def snapshot(self, fork, k):
        t0 = time.perf_counter()
        self.octo.call("snapshot", fork.thread)
        return time.perf_counter() - t0

    def processes(self):
        return [self.octo.proc.pid]

    def requests(self, fork):
        """The FUSE requests the fork's mount has answered so far, by opcode (`octofs stats
        <thread> --json`); {} when the daemon does not know the thread (yet)."""
        r = self.octo.call("stats", fork.thread, "--json", check=False)
        if r.returncode != 0:
            return {}
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            return {}
        for w in doc.get("workspaces", []):
            if w.get("thread") == fork.thread:
                return {o["op"]: o["count"] for o in w["stats"]["ops"] if o.get("count")}
        return {}


class OctoHandles(Octo):
    """octofs with its threads in handles mode, whatever auto would choose: the same daemon as
    `octofs`, each thread opened with `octofs open --io handles`."""
    name, label = "octofs-handles", "octofs, handles"
    desc = ("the same daemon and mirror as `octofs`, each thread opened with `octofs open --io "
            "handles`: OPEN/RELEASE per open file, reads and writes through passthrough to the "
            "blob cache's files (one page cache for every workspace)")
    io = "handles"
    tag = "-handles"

    def resident(self, forks):
        return resident_bytes([os.path.join(self.octo.state, "blobs")])


class OctoNoOpen(Octo):
    """octofs with its threads in no-open mode: the same daemon as `octofs`, each thread opened
    with `octofs open --io no-open` (the kernel opens files without asking; no passthrough)."""
    name, label = "octofs-no-open", "octofs, no-open"
    desc = ("the same daemon and mirror as `octofs`, each thread opened with `octofs open --io "
            "no-open`: no OPEN/RELEASE/FLUSH requests, reads through the mount's own page cache "
            "(no passthrough)")
    io = "no-open"
    tag = "-noopen"
    # resident(): `Octo`'s, which adds each no-open mount's own page cache (a copy per mount).

    def fork(self):
        f = super().fork()
        io = self.octo.status(f.thread).get("io")
        if io != "no-open":
            self.remove(f)
            raise Skip(f"`octofs open --io no-open` mounted the thread with io {io!r} "
                       "(the kernel does not offer FUSE_NO_OPEN_SUPPORT?)")
        return f


class OctoDev(Octo):
    """octofs on the `/dev/fuse` transport (the default before 2026-12-04): a daemon of its own
    started with `OCTOFS_TRANSPORT=dev`, the I/O mode left to `auto`."""
    name, label = "octofs-dev", "octofs, /dev/fuse"
    desc = ("`octofs open` on a daemon of its own started with `--transport dev` (requests read "
            "from /dev/fuse by a pool of threads, woken on any CPU), `--io auto`")
    daemon_key = "dev"
    daemon_env = {"OCTOFS_TRANSPORT": "dev"}


class OctoUring(Octo):
    """octofs on the FUSE-over-io_uring transport: a daemon of its own started with
    `OCTOFS_TRANSPORT=uring`, threads in handles mode."""
    name, label = "octofs-uring", "octofs, io_uring"
    desc = ("`octofs open` on a daemon of its own started with `--transport uring` (FUSE over "
            "io_uring: one queue per CPU, a request served on its caller's CPU), handles mode")
    daemon_key = "uring"
    daemon_env = {"OCTOFS_TRANSPORT": "uring", "OCTOFS_IO": "handles"}

    def fork(self):
        f = super().fork()
        transport = self.octo.status(f.thread).get("transport") or ""
        if not transport.startswith("uring"):
            self.remove(f)
            raise Skip(f"the daemon started with OCTOFS_TRANSPORT=uring mounted the thread on "
                       f"{transport!r} (the kernel does not offer FUSE over io_uring?)")
        return f


class OctoCopy(Octo):
    """octofs as it was before dependency layers: the same daemon code with no layer built, so
    each fork `cp -a`s the ignored dependencies into the mount (the figure layers replace)."""
    name, label = "octofs-copy", "octofs, no layer (cp -a)"
    desc = ("`octofs open` of the repository's mirror (its own daemon and state) with its "
            "dependency layer records removed after `mirror add`, so the ignored dependencies are "
            "copied into each mount with `cp -a`, as without layers")

    daemon_key = "nolayer"

    def prepare(self, corpus):
        super().prepare(corpus)
        layers = os.path.join(self.octo.state, "deps", "layers")
        if os.path.isdir(layers):
            for f in os.listdir(layers):
                os.remove(os.path.join(layers, f))


# The reference first, then octofs as a user gets it (its default configuration), then its named
# alternatives, then the other ways to get a workspace.
ALL = [Native, Octo, OctoHandles, OctoNoOpen, OctoDev, OctoUring, OctoCopy, CloneLocal, Worktree, Copy, Reflink,
       Overlay, FuseOverlay]
NAMES = [m.name for m in ALL]
# Names of earlier runs, still accepted by --methods.
ALIASES = {"octofs-noopen": "octofs-no-open"}


def process_rss(pids):
    vals = [rss(p) for p in pids]
    return sum(v for v in vals if v is not None)
