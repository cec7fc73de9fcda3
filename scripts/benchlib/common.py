"""Shared helpers of the benchmark: running commands, formatting, statistics, mounts, caches,
memory and disk accounting, and the octofs daemon of a run. Nothing here measures anything."""

import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

MIB = 1024 * 1024
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRCDIR = os.path.dirname(HERE)

# Same command in every tree, run with the tree as working directory; `.git` is pruned.
READ_CMD = "find . -path ./.git -prune -o -type f -print0 | xargs -0 -r cat > /dev/null"
STAT_CMD = "find . -path ./.git -prune -o -printf '%s %i\\n' > /dev/null"


class BenchError(Exception):
    pass


class Skip(Exception):
    """A method or figure that cannot run here; the message is the reason shown in the report."""


class Interrupted(Exception):
    pass


_T0 = time.monotonic()


def log(msg):
    t = time.monotonic() - _T0
    print(f"[bench {int(t // 60):3d}:{t % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def git_env(**extra):
    """A deterministic git identity and dates, no user or system config."""
    env = dict(os.environ, GIT_AUTHOR_NAME="Bench", GIT_AUTHOR_EMAIL="bench@example.invalid",
               GIT_COMMITTER_NAME="Bench", GIT_COMMITTER_EMAIL="bench@example.invalid",
               GIT_AUTHOR_DATE="1700000000 +0000", GIT_COMMITTER_DATE="1700000000 +0000",
               GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    env.pop("GIT_DIR", None)
    env.pop("GIT_INDEX_FILE", None)
    env.update(extra)
    return env


GENV = git_env()


def run(cmd, *, cwd=None, env=None, check=True, timeout=3600, input=None, stdout=subprocess.PIPE):
    """Runs cmd (a list, or a string for bash); raises BenchError with the last stderr line."""
    shell = isinstance(cmd, str)
    argv = ["bash", "-c", cmd] if shell else cmd
    shown = cmd if shell else " ".join(cmd)
    shown = shown if len(shown) < 160 else shown[:150] + " …"
    try:
        r = subprocess.run(argv, cwd=cwd, env=GENV if env is None else env, input=input,
                           stdout=stdout, stderr=subprocess.PIPE, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{shown}` timed out after {timeout} s")
    if check and r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()
        raise BenchError(f"`{shown}` failed (exit {r.returncode}): "
                         + (err[-1] if err else "no message"))
    return r


def out(r):
    return r.stdout.decode(errors="replace").strip()


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def timed_cmd(cmd, cwd, env=None, timeout=3600):
    t = time.perf_counter()
    run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


# --- statistics and formatting ----------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_t(s):
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def fmt_b(b):
    if b is None:
        return "—"
    if abs(b) < 1024:
        return f"{b:.0f} B"
    for unit, div in (("KiB", 1024), ("MiB", MIB), ("GiB", 1024 * MIB)):
        if abs(b) < div * 1024 or unit == "GiB":
            return f"{b / div:.2f} {unit}" if abs(b) < div * 10 else f"{b / div:.0f} {unit}"


def fmt_stat(xs, f=fmt_t):
    xs = [x for x in xs or [] if x is not None]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f(xs[0])
    return f"{f(med(xs))} ({f(min(xs))}–{f(max(xs))})"


def fmt_ratio(r):
    if r is None:
        return "—"
    if r == 0:
        return "0×"
    return f"{r:.2g}×" if r < 0.1 else (f"{r:.2f}×" if r < 100 else f"{r:.0f}×")


# --- the machine ------------------------------------------------------------------------------

def mounts_under(prefix):
    """Mount points at or below `prefix` (from /proc/self/mountinfo), deepest first."""
    prefix = os.path.realpath(prefix)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp == prefix or mp.startswith(prefix + "/"):
                    found.append(mp)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def fs_type_of(path):
    """(mount point, fs type, source) of the file system holding path."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                mp = parts[4]
                sep = parts.index("-")
                if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
                    best = (mp, parts[sep + 1], parts[sep + 2])
    except OSError:
        pass
    return best


def unmount(mp):
    """umount, then a lazy unmount if it is busy. Never raises."""
    if subprocess.run(["umount", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


CAN_DROP = os.geteuid() == 0


def drop_caches():
    """Write back, then drop the page cache, dentries and inodes (root only)."""
    os.sync()
    if not CAN_DROP:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def meminfo(key):
    """A /proc/meminfo field in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def rss(pid):
    """Resident set of one process in bytes (VmRSS), None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pids_of_exe(path):
    """Processes whose executable is `path` (by /proc/PID/exe, not by name)."""
    real = os.path.realpath(path)
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/exe") == real:
                    found.append(int(d))
            except OSError:
                pass
    return found


def pids_with_arg(arg, exe_word=b"octofs"):
    me = os.getpid()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if arg.encode() in argv and any(exe_word in a for a in argv[:1]):
            found.append(int(d))
    return found


def disk_bytes(*paths, seen=None):
    """Allocated bytes (st_blocks * 512) under `paths`, each inode counted once (an inode in
    `seen`, a set of (dev, ino), is not counted and `seen` is updated), not crossing file systems,
    not following symlinks."""
    seen = set() if seen is None else seen
    total = 0
    for top in paths:
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        dev = st.st_dev
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        stack = [top] if os.path.isdir(top) and not os.path.islink(top) else []
        while stack:
            d = stack.pop()
            try:
                it = os.scandir(d)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            with it:
                for e in it:
                    try:
                        s = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if s.st_dev != dev or (s.st_dev, s.st_ino) in seen:
                        continue
                    seen.add((s.st_dev, s.st_ino))
                    total += s.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
    return total


def inodes_of(top):
    """The set of (dev, ino) under top (for `disk_bytes(seen=...)`)."""
    seen = set()
    disk_bytes(top, seen=seen)
    return seen


def fs_used(path):
    """Used bytes of the file system holding path (after a sync)."""
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_times():
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def wait_quiet(limit, threshold=0.15, window=1.0):
    """Waits at most `limit` s until the CPUs were busy less than `threshold` of one `window`;
    other work on a shared machine skews timings. Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        b0, a0 = cpu_times()
        time.sleep(window)
        b1, a1 = cpu_times()
        if (b1 - b0) / max(1, a1 - a0) < threshold or time.monotonic() - t0 >= limit:
            return time.monotonic() - t0


def cpu_idle():
    """The cpuidle driver and, for a virtual machine's `haltpoll`, how long an idle CPU polls
    before it halts: with 0 every FUSE round trip that finds a CPU idle pays a VM exit
    (docs/performance.md "An idle virtual machine"), which moves most FUSE figures."""
    def read(p):
        try:
            with open(p) as f:
                return f.read().strip()
        except OSError:
            return None
    driver = read("/sys/devices/system/cpu/cpuidle/current_driver") or "none"
    poll = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if driver == "haltpoll" and poll is not None:
        return f"{driver}, guest_halt_poll_ns {poll}"
    return driver


def machine_info(work, extra=()):
    info = []
    u = platform.uname()
    info.append(("kernel", f"{u.system} {u.release} ({u.machine})"))
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        pass
    info.append(("CPUs", f"{os.cpu_count()} × {cpu}"))
    info.append(("memory", f"{(meminfo('MemTotal') or 0) / 2**30:.1f} GiB"))
    info.append(("CPU idle", cpu_idle()))
    mp, fstype, source = fs_type_of(work)
    info.append(("file system of the run", f"{fstype} ({source} on {mp})"))
    try:
        info.append(("distribution", platform.freedesktop_os_release().get("PRETTY_NAME", "?")))
    except (OSError, AttributeError):
        pass
    info.append(("git", out(run(["git", "--version"]))))
    info.extend(extra)
    return info


# --- the octofs daemon of a run ---------------------------------------------------------------

def _pdeathsig():
    """In a daemon child: SIGTERM when the benchmark dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def socket_alive(path):
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Octofs:
    """One private daemon (`--state`/`--root` in the run's directory), stopped by `stop()`."""

    def __init__(self, binary, state, root, logpath):
        self.bin, self.state, self.root, self.logpath = binary, state, root, logpath
        os.makedirs(state, exist_ok=True)
        os.makedirs(root, exist_ok=True)
        self.proc = None
        self.env = dict(os.environ, OCTOFS_STATE=state, OCTOFS_ROOT=root)
        self.env.setdefault("OCTOFS_LOG", "info")

    def cmd(self, *args):
        return [self.bin, "--state", self.state, "--root", self.root, *args]

    def call(self, *args, timeout=3600, check=True):
        r = subprocess.run(self.cmd(*args), env=self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            raise BenchError(f"`octofs {' '.join(args)}` failed (exit {r.returncode}): "
                             + (err[-1] if err else "no message"))
        return r

    def start(self, timeout=60):
        sock = os.path.join(self.state, "octofs.sock")
        with open(self.logpath, "ab") as logf:
            self.proc = subprocess.Popen(self.cmd("serve"), env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_pdeathsig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"octofs serve exited with {self.proc.returncode}; log tail:\n"
                                 f"{self.log_tail()}")
            if socket_alive(sock):
                return
            time.sleep(0.05)
        raise BenchError(f"octofs serve: no socket at {sock} after {timeout} s")

    def open(self, thread, project, io=None):
        """`octofs open <thread> --project <project>` (with `--io <io>` when given): the mount."""
        r = self.call("open", thread, "--project", project, *(["--io", io] if io else []))
        path = out(r).splitlines()[-1]
        if not os.path.ismount(path):
            raise BenchError(f"`octofs open {thread}` printed {path}, which is not a mount point")
        return path

    def status(self, thread):
        r = self.call("status", thread, "--json", check=False)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {}

    def log_tail(self, n=15):
        try:
            with open(self.logpath, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join("    " + l for l in lines[-n:])
        except OSError:
            return "    (no log)"

    def stop(self):
        """`octofs stop`, then SIGTERM/SIGKILL by pid, then lazy unmounts. Never raises."""
        if socket_alive(os.path.join(self.state, "octofs.sock")):
            try:
                subprocess.run(self.cmd("stop"), env=self.env, timeout=60,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except Exception:
                pass
        if self.proc is not None:
            for sig, wait in ((None, 15), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                if sig is not None and self.proc.poll() is None:
                    log(f"octofs daemon (pid {self.proc.pid}) still running: sending {sig.name}")
                    try:
                        os.kill(self.proc.pid, sig)
                    except ProcessLookupError:
                        pass
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # a daemon the CLI auto-started with our private state is ours too: found by that
        # unique path in its command line, ended by pid
        for pid in pids_with_arg(self.state):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for mp in mounts_under(self.root):
            unmount(mp)


def describe_source():
    head = out(run(["git", "-C", SRCDIR, "rev-parse", "--short", "HEAD"], check=False))
    dirty = out(run(["git", "-C", SRCDIR, "status", "--porcelain", "--untracked-files=no", "--",
                     "src", "Cargo.toml", "Cargo.lock"], check=False))
    return (head or "(no commit)") + (" + uncommitted changes in src/" if dirty else "")


def build_octofs():
    """The octofs binary: $OCTOFS_BIN, or `cargo build --release` of this checkout."""
    b = os.environ.get("OCTOFS_BIN")
    if b:
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            raise BenchError(f"OCTOFS_BIN={b} is not an executable file")
        return os.path.abspath(b), f"OCTOFS_BIN={b} (tree at {describe_source()})"
    log("building octofs (cargo build --release)")
    r = subprocess.run(["cargo", "build", "--release", "--bin", "octofs"], cwd=SRCDIR)
    if r.returncode != 0:
        raise BenchError("cargo build --release failed")
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=SRCDIR,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    target = os.path.join(SRCDIR, "target")
    try:
        target = json.loads(meta.stdout)["target_directory"]
    except Exception:
        pass
    b = os.path.join(target, "release", "octofs")
    if not os.path.isfile(b):
        raise BenchError(f"build succeeded but {b} does not exist")
    return b, f"built from {describe_source()}"


def now():
    return datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def resident_bytes(paths):
    """Bytes of the page cache that the regular files under `paths` hold (`fincore`, which maps
    each file and asks `mincore`), `.git` directories skipped; None without fincore."""
    if not shutil.which("fincore"):
        return None
    total = 0
    for p in paths:
        r = run(f"find . -path ./.git -prune -o -type f -print0 | xargs -0 -r fincore --bytes "
                f"--noheadings --output RES 2>/dev/null", cwd=p, check=False)
        total += sum(int(x) for x in r.stdout.split() if x.isdigit())
    return total

