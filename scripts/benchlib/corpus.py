"""The corpora of the benchmark, made on the machine from nothing but git, cargo and npm:

- `generated`: a repository of N files with a realistic shape (nested directories of ~10-50 files,
  sizes mostly 1-20 KiB with a tail up to 1 MiB, executables, symlinks) plus a generated C project
  under `build/`, and a second commit on branch `renamed` that moves about a tenth of the tree;
- `real`: the vendored sources of octofs's own dependencies (`cargo vendor`), LuaJIT's sources from
  the `luajit-src` crate (the build) and a package.json whose `npm install` fills an ignored
  `node_modules`; its second commit moves vendored crates the same way.

A corpus is a git repository with a checkout (the template every method forks from, never modified
while a fork exists) and its ignored dependency trees installed in that checkout."""

import dataclasses
import glob
import hashlib
import json
import os
import posixpath
import random
import shutil
import subprocess
import tarfile
import time

from .common import MIB, BenchError, log, out, run

CRATE_NAME = "luajit-src"
CRATE_VERSION = "210.7.4"           # pinned: the same sources on every machine
NPM_FULL = "typescript@5 eslint@9 prettier@3 jest@29 webpack@5 express@4 lodash@4"
NPM_QUICK = "express@4 lodash@4"


@dataclasses.dataclass
class Build:
    subdir: str          # where `make` runs, relative to the tree
    cmd: list            # the timed build command
    check: list          # a command (relative to the tree) whose success shows the build works
    desc: str


@dataclasses.dataclass
class Corpus:
    name: str
    repo: str            # the repository and its checkout (the template)
    deps: list           # ignored dependency trees installed in the template, relative paths
    base: str            # commit id of `main`
    other: str           # commit id of `renamed` (child of main, a tenth of the tree moved)
    build: Build
    desc: str
    files: int = 0       # tracked entries
    dep_entries: int = 0


# ------------------------------------------------------------------------------------------------
# The generated repository
# ------------------------------------------------------------------------------------------------

WORDS = ("alpha beta gamma delta core util utils common model view controller service client "
         "server handler parser lexer render layout style config settings schema types api net "
         "http store cache queue worker task job event stream buffer index table column row "
         "query plan exec runtime compiler codegen ast ir opt lint fmt test tests fixture mock "
         "helper widget button form input label icon theme color image audio video media auth "
         "user account session token crypto hash sign verify log trace metric report chart graph "
         "node edge tree list map set vec str bytes file path dir fs io sys os proc thread sync "
         "lock mutex channel signal timer clock date time locale i18n text doc docs readme "
         "plugin loader module package build script tool cli main app lib src pkg internal "
         "vendor third_party legacy v2 experimental").split()
DIR_WORDS = ("src lib pkg internal cmd api core utils common components services models views "
             "controllers handlers middleware routes store hooks tests fixtures docs examples "
             "scripts tools build config assets static public styles images icons i18n locales "
             "vendor plugins modules packages apps server client shared types schema migrations "
             "generated proto bench benches test spec integration e2e unit mocks data").split()
EXTS = ["rs", "py", "ts", "tsx", "js", "go", "c", "h", "cc", "java", "md", "json", "yaml",
        "toml", "txt", "css", "html"]
MAX_DEPTH = 8


def _text_pool(rng, size):
    """Pseudo source text: lines of words, indentation and punctuation."""
    words = [w.encode() for w in WORDS]
    puncts = [b"(", b");", b" = ", b", ", b" {", b"}", b"::", b".", b" -> ", b" + "]
    out = bytearray()
    while len(out) < size:
        line = bytearray(b"    " * rng.randrange(0, 4))
        for _ in range(rng.randrange(2, 12)):
            line += rng.choice(words)
            line += rng.choice(puncts)
        line += b"\n"
        out += line
    return bytes(out)


def _pick_size(rng):
    r = rng.random()
    if r < 0.05:
        return rng.randrange(16, 1024)                       # tiny
    if r < 0.95:
        return int(1024 * 20 ** rng.random())                # 1-20 KiB, log-uniform
    if r < 0.995:
        return int(20 * 1024 * 6.4 ** rng.random())          # 20-128 KiB
    return int(128 * 1024 * 8 ** rng.random())               # 128 KiB-1 MiB


def generate_repo(repo, nfiles, seed=42):
    """Create `repo` (git init + fast-import + checkout) with `nfiles` entries that are files or
    symlinks. Returns a dict of statistics."""
    t0 = time.perf_counter()
    rng = random.Random(seed * 1_000_003 + nfiles)
    # 1 MiB of distinct text, repeated with a shift: slices of it are unique enough and cheap
    unit = _text_pool(rng, MIB)
    pool = b"".join(unit[k * 4099:] + unit[:k * 4099] for k in range(5))
    pool_max = len(pool)

    # --- tree shape: a random recursive tree of directories, each with ~10-50 entries ---
    dirs = [("", 0)]          # (path, depth)
    children = {"": set()}
    plan = []                 # (dir path, number of files)
    remaining = nfiles
    first = min(remaining, rng.randrange(8, 20))
    plan.append(("", first))
    remaining -= first
    while remaining > 0:
        while True:
            parent, depth = rng.choice(dirs)
            if depth < MAX_DEPTH:
                break
        base = rng.choice(DIR_WORDS)
        name, k = base, 1
        while name in children[parent]:
            k += 1
            name = f"{base}{k}"
        children[parent].add(name)
        path = f"{parent}/{name}" if parent else name
        dirs.append((path, depth + 1))
        children[path] = set()
        if rng.random() < 0.1:
            count = rng.randrange(0, 6)                      # some mostly-structural dirs
        else:
            count = rng.randrange(10, 51)
        count = min(count, remaining)
        plan.append((path, count))
        remaining -= count

    # --- entries ---
    entries = []              # (mode, path, kind) kind in {"f", "x", "l"}
    for d, count in plan:
        used = set()
        for _ in range(count):
            kind = "f"
            r = rng.random()
            if r < 0.03:
                kind = "x"
                ext = rng.choice(["sh", "py", ""])
            else:
                ext = rng.choice(EXTS)
            base = rng.choice(WORDS)
            name = base + ("." + ext if ext else "")
            k = 1
            while name in used or name in children[d]:
                k += 1
                name = f"{base}_{k}" + ("." + ext if ext else "")
            used.add(name)
            entries.append(("100755" if kind == "x" else "100644", f"{d}/{name}" if d else name, kind))
    # symlinks: ~0.2% of N (at least 4): relative links to files and dirs, one dangling
    nlinks = max(4, nfiles // 500)
    nlinks = min(nlinks, max(0, len(entries) - 2))
    file_paths = [p for _, p, _ in entries]
    for i in range(nlinks):
        j = rng.randrange(len(entries))
        mode, path, kind = entries[j]
        here = posixpath.dirname(path)
        if i == 0:
            target = "does/not/exist.txt"                                   # dangling
        elif i == 1 and len(dirs) > 1:
            target = posixpath.relpath(rng.choice(dirs[1:])[0], here or ".")  # to a directory
        else:
            target = posixpath.relpath(rng.choice(file_paths), here or ".")
        entries[j] = ("120000", path, "l:" + target)

    # --- fast-import streams: blobs spread over one fast-import per CPU (zlib and SHA-1 are the
    # cost), then one small fast-import that builds the commit from the blobs' object ids ---
    if os.path.exists(repo):
        raise BenchError(f"{repo} already exists")
    run(["git", "init", "-q", "-b", "main", repo])
    run(["git", "-C", repo, "config", "core.compression", "1"])   # fast to generate; reads unaffected
    run(["git", "-C", repo, "config", "gc.auto", "0"])
    nproc = max(1, min(4, os.cpu_count() or 1))
    importers = [subprocess.Popen(["git", "-C", repo, "fast-import", "--quiet", "--depth=0"],
                                  stdin=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(nproc)]
    for p in importers:                 # deep pipes, so that one busy importer does not stall us
        try:
            import fcntl
            fcntl.fcntl(p.stdin.fileno(), 1031, 4 * MIB)   # F_SETPIPE_SZ
        except OSError:
            pass
    stats = {"regular": 0, "exec": 0, "symlink": 0, "bytes": 0, "larger_than_20k": 0}
    oids = []
    try:
        for i, (mode, path, kind) in enumerate(entries):
            if kind.startswith("l:"):
                data = kind[2:].encode()
                stats["symlink"] += 1
            else:
                size = _pick_size(rng)
                header = (f"#!/bin/sh\n# {path}\n" if kind == "x" else f"// {path}\n").encode()
                off = rng.randrange(0, pool_max - size) if size < pool_max else 0
                data = header + pool[off:off + size]
                stats["regular"] += 1
                stats["exec"] += kind == "x"
                stats["bytes"] += len(data)
                stats["larger_than_20k"] += len(data) > 20 * 1024
            hdr = b"blob %d\0" % len(data)
            h = hashlib.sha1(hdr)
            h.update(data)
            oids.append(h.hexdigest())
            w = importers[i % nproc].stdin
            w.write(b"blob\ndata %d\n" % len(data))
            w.write(data)
            w.write(b"\n")
        for p in importers:
            p.stdin.close()
    except BrokenPipeError:
        pass
    for p in importers:
        err = p.stderr.read().decode(errors="replace").strip().splitlines()
        if p.wait() != 0:
            raise BenchError(f"git fast-import (blobs) failed: {err[-1] if err else ''}")
    msg = f"generated repository: {nfiles} files\n".encode()
    commit = [b"commit refs/heads/main\n",
              b"author Bench <bench@example.invalid> 1700000000 +0000\n",
              b"committer Bench <bench@example.invalid> 1700000000 +0000\n",
              b"data %d\n%s\n" % (len(msg), msg)]
    for oid, (mode, path, kind) in zip(oids, entries):
        commit.append(f"M {mode} {oid} {path}\n".encode())
    commit.append(b"\ndone\n")
    run(["git", "-C", repo, "fast-import", "--quiet"], input=b"".join(commit))
    t1 = time.perf_counter()
    run(["git", "-C", repo, "checkout", "-q", "-f", "main"])
    t2 = time.perf_counter()
    stats.update(files=nfiles, dirs=len(dirs), depth=max(d for _, d in dirs),
                 import_s=t1 - t0, checkout_s=t2 - t1)
    return stats


def moved_commit(repo, seed, share=0.1):
    """Branch `renamed`: a child of main in which whole directories holding about `share` of the
    tracked files are moved (renamed with a suffix, some moved under another directory), a few
    single files renamed and 0.5 % of the files edited. Returns (commit, files moved)."""
    rng = random.Random(seed)
    files = run(["git", "-C", repo, "ls-tree", "-r", "-z", "--name-only", "main"]).stdout.decode(
        errors="surrogateescape").split("\0")
    files = [f for f in files if f]
    count = {}
    for f in files:
        d = posixpath.dirname(f)
        while d:
            count[d] = count.get(d, 0) + 1
            d = posixpath.dirname(d)
    dirs = sorted(count)
    rng.shuffle(dirs)
    chosen, moved = [], 0
    for d in dirs:
        if moved >= share * len(files):
            break
        if d.split("/")[0] == "build" or count[d] > share * len(files) / 3:
            continue
        if any(d == c or d.startswith(c + "/") or c.startswith(d + "/") for c in chosen):
            continue
        chosen.append(d)
        moved += count[d]
    cmds = []
    targets = set()
    for i, d in enumerate(chosen):
        parent, name = posixpath.split(d)
        new = posixpath.join(parent, f"{name}_moved") if i % 3 else f"moved/{d.replace('/', '_')}"
        targets.add(new)
        cmds.append(f'R "{d}" "{new}"\n')
    inside = lambda f: any(f.startswith(c + "/") for c in chosen)
    rest = [f for f in files if not inside(f) and not f.startswith("build/")]
    rng.shuffle(rest)
    singles = rest[:max(1, len(files) // 200)]
    edits = rest[len(singles):len(singles) + max(1, len(files) // 200)]
    for f in singles:
        cmds.append(f'R "{f}" "{f}.renamed"\n')
    stream = [b"commit refs/heads/renamed\n",
              b"author Bench <bench@example.invalid> 1700000100 +0000\n",
              b"committer Bench <bench@example.invalid> 1700000100 +0000\n",
              b"data 25\nmove a tenth of the tree\n", b"from refs/heads/main^0\n"]
    stream += [c.encode(errors="surrogateescape") for c in cmds]
    blob_of = dict(l.split("\t", 1)[::-1] for l in run(
        ["git", "-C", repo, "ls-tree", "-r", "main", "--"] + edits).stdout.decode(
        errors="surrogateescape").splitlines()) if edits else {}
    for f in edits:
        meta = blob_of.get(f, "100644 blob x").split()
        if meta[0] not in ("100644", "100755"):
            continue
        data = run(["git", "-C", repo, "cat-file", "blob", meta[2]]).stdout + b"edited by the move\n"
        stream.append(f'M {meta[0]} inline "{f}"\n'.encode(errors="surrogateescape"))
        stream.append(b"data %d\n%s\n" % (len(data), data))
    stream.append(b"\ndone\n")
    run(["git", "-C", repo, "fast-import", "--quiet", "--force"], input=b"".join(stream))
    return out(run(["git", "-C", repo, "rev-parse", "renamed"])), moved + len(singles)


def commit_all(repo, message):
    run(["git", "-C", repo, "add", "-A", "--", "."])
    run(["git", "-C", repo, "commit", "-q", "--no-verify", "-m", message])


def make_generated(work, nfiles, ntu, seed=42):
    repo = os.path.join(work, "corpus-generated")
    log(f"generated corpus: {nfiles:,} files")
    st = generate_repo(repo, nfiles, seed=seed)
    generate_c_project(os.path.join(repo, "build"), ntu=ntu)
    commit_all(repo, f"build/: a generated C project of {ntu} translation units")
    other, moved = moved_commit(repo, seed)
    base = out(run(["git", "-C", repo, "rev-parse", "main"]))
    build = Build("build", ["make", "-j2"], ["./build/prog"],
                  f"`make -j2` of the generated C project ({ntu} translation units + main, -O2)")
    ntracked = len(run(["git", "-C", repo, "ls-files", "-z"]).stdout.split(b"\0")) - 1
    desc = (f"{ntracked:,} tracked files ({st['regular']:,} regular, {st['exec']:,} executable, "
            f"{st['symlink']:,} symlinks) in {st['dirs']:,} directories, max depth {st['depth']}, "
            f"{st['bytes'] / MIB:.0f} MiB; `build/`: generated C project of {ntu} translation units; "
            f"branch `renamed` moves {moved:,} files")
    return Corpus("generated", repo, [], base, other, build, desc, ntracked, 0)


# ------------------------------------------------------------------------------------------------
# The real repository
# ------------------------------------------------------------------------------------------------

def cargo_home():
    return os.environ.get("CARGO_HOME") or os.path.join(os.path.expanduser("~"), ".cargo")


def find_crate_file():
    pat = os.path.join(cargo_home(), "registry", "cache", "*", f"{CRATE_NAME}-{CRATE_VERSION}*.crate")
    hits = sorted(glob.glob(pat))
    return hits[-1] if hits else None


def fetch_crate(work):
    """The .crate file of luajit-src from the local cargo cache, fetching it through cargo (the
    registry's ordinary client) when it is missing."""
    f = find_crate_file()
    if f:
        return f
    if not shutil.which("cargo"):
        raise BenchError("cargo not found: cannot fetch the luajit-src crate")
    proj = os.path.join(work, "crate-fetch")
    os.makedirs(os.path.join(proj, "src"))
    with open(os.path.join(proj, "Cargo.toml"), "w") as fh:
        fh.write('[package]\nname = "bench-write-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
                 'publish = false\n\n[dependencies]\n'
                 f'{CRATE_NAME} = "={CRATE_VERSION}"\n\n[workspace]\n')
    with open(os.path.join(proj, "src", "lib.rs"), "w") as fh:
        fh.write("")
    log(f"fetching {CRATE_NAME} {CRATE_VERSION} with cargo")
    run(["cargo", "fetch", "--manifest-path", os.path.join(proj, "Cargo.toml")], timeout=900)
    f = find_crate_file()
    if not f:
        raise BenchError(f"cargo fetch succeeded but no {CRATE_NAME}-{CRATE_VERSION}*.crate in "
                         f"{cargo_home()}/registry/cache")
    return f


def extract_luajit(crate, dest):
    """Unpacks `<crate>/luajit2/` of the .crate (a tar.gz) into dest; returns the crate's name."""
    with tarfile.open(crate, "r:gz") as tf:
        members = []
        top = None
        for m in tf.getmembers():
            parts = m.name.split("/")
            if len(parts) < 3 or parts[1] != "luajit2":
                continue
            top = parts[0]
            m.name = "/".join(parts[2:])
            members.append(m)
        if not members:
            raise BenchError(f"{crate} has no luajit2/ directory")
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(dest, members=members, **kw)
    return top


def generate_c_project(dest, ntu=200, seed=7):
    """A generated C project: `ntu` translation units with shared headers and a Makefile that
    builds them into a static library and a program."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(dest, "src"))
    os.makedirs(os.path.join(dest, "include"))
    with open(os.path.join(dest, "include", "common.h"), "w") as f:
        f.write("#ifndef COMMON_H\n#define COMMON_H\n#include <stdint.h>\n#include <stddef.h>\n"
                "#include <string.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
                "typedef struct { uint64_t a, b, c, d; } state_t;\n"
                "static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }\n"
                "static inline uint64_t mix(state_t *s) {\n"
                "  uint64_t r = rotl(s->b * 5, 7) * 9, t = s->b << 17;\n"
                "  s->c ^= s->a; s->d ^= s->b; s->b ^= s->c; s->a ^= s->d; s->c ^= t;\n"
                "  s->d = rotl(s->d, 45); return r; }\n")
        for i in range(ntu):
            f.write(f"uint64_t unit{i}_run(uint64_t seed);\n")
        f.write("#endif\n")
    for i in range(ntu):
        with open(os.path.join(dest, "src", f"unit{i:03d}.c"), "w") as f:
            f.write('#include "common.h"\n\n')
            nfun = rng.randrange(8, 16)
            for j in range(nfun):
                k1, k2 = rng.randrange(1, 63), rng.randrange(3, 40)
                f.write(f"static uint64_t f{j}(state_t *s, uint64_t x) {{\n"
                        f"  uint64_t acc = x;\n"
                        f"  for (int i = 0; i < {k2}; i++) {{\n"
                        f"    acc += mix(s) ^ rotl(acc, {k1});\n"
                        f"    switch ((acc >> 3) & 7) {{\n")
                for c in range(8):
                    f.write(f"      case {c}: acc = acc * {rng.randrange(3, 1 << 30)}u + {c}; break;\n")
                f.write("    }\n  }\n"
                        f"  char buf[64]; snprintf(buf, sizeof buf, \"%llu-{i}-{j}\", "
                        "(unsigned long long)acc);\n"
                        "  return acc ^ strlen(buf);\n}\n\n")
            f.write(f"uint64_t unit{i}_run(uint64_t seed) {{\n"
                    "  state_t s = { seed, seed ^ 0x9e3779b97f4a7c15ull, 3, 4 };\n  uint64_t r = 0;\n")
            for j in range(nfun):
                f.write(f"  r ^= f{j}(&s, r + {j});\n")
            f.write("  return r;\n}\n")
    with open(os.path.join(dest, "src", "main.c"), "w") as f:
        f.write('#include "common.h"\nint main(void) {\n  uint64_t r = 0;\n')
        for i in range(ntu):
            f.write(f"  r ^= unit{i}_run(r + {i});\n")
        f.write('  printf("%llu\\n", (unsigned long long)r);\n  return 0;\n}\n')
    with open(os.path.join(dest, "Makefile"), "w") as f:
        f.write("CC ?= cc\nCFLAGS ?= -O2 -g -Wall\n"
                "SRCS := $(wildcard src/unit*.c)\nOBJS := $(SRCS:.c=.o)\n\n"
                "all: prog\n\nprog: src/main.o libunits.a\n\t$(CC) -o $@ $^\n\n"
                "libunits.a: $(OBJS)\n\tar rcs $@ $^\n\n"
                "src/%.o: src/%.c include/common.h\n\t$(CC) $(CFLAGS) -Iinclude -c -o $@ $<\n\n"
                "clean:\n\trm -f src/*.o libunits.a prog\n\n.PHONY: all clean\n")
    with open(os.path.join(dest, ".gitignore"), "w") as f:
        f.write("*.o\n*.a\n/prog\n")


def cargo_vendor(dest):
    """`cargo vendor` of octofs's own dependencies (offline first: they are usually in the cache)."""
    from .common import SRCDIR
    manifest = os.path.join(SRCDIR, "Cargo.toml")
    env = dict(os.environ)
    for offline in (True, False):
        r = run(["cargo", "vendor", "--manifest-path", manifest, "--versioned-dirs", dest]
                + (["--offline"] if offline else []), env=env, check=False, timeout=1800)
        if r.returncode == 0:
            return
    err = r.stderr.decode(errors="replace").strip().splitlines()
    raise BenchError(f"cargo vendor failed: {err[-1] if err else r.returncode}")


def make_real(work, npm_packages, small=False):
    repo = os.path.join(work, "corpus-real")
    log("real corpus: cargo vendor, luajit-src, npm install")
    os.makedirs(repo)
    run(["git", "init", "-q", "-b", "main", repo])
    run(["git", "-C", repo, "config", "gc.auto", "0"])
    cargo_vendor(os.path.join(repo, "vendor"))
    pruned = ""
    if small:
        # the Windows import-library crates are half the bytes (3,600 files, 130 MiB)
        gone = [d for d in os.listdir(os.path.join(repo, "vendor")) if d.startswith("win")]
        for d in gone:
            shutil.rmtree(os.path.join(repo, "vendor", d))
        pruned = f" (without the {len(gone)} `win*` crates: --quick)"
    crate = fetch_crate(work)
    top = extract_luajit(crate, os.path.join(repo, "luajit"))
    with open(os.path.join(repo, ".gitignore"), "w") as f:
        f.write("/node_modules/\n")
    with open(os.path.join(repo, "luajit", ".gitignore"), "w") as f:
        f.write("*.o\n*.a\n*.so\n*.so.*\n/src/luajit\n/src/host/minilua\n/src/host/buildvm\n"
                "/src/host/buildvm_arch.h\n/src/lj_bcdef.h\n/src/lj_ffdef.h\n/src/lj_folddef.h\n"
                "/src/lj_libdef.h\n/src/lj_recdef.h\n/src/lj_vm.S\n/src/jit/vmdef.lua\n"
                "/src/luajit_relver.txt\n/src/luajit.h\n")
    deps = {}
    for p in npm_packages.split():
        name, _, ver = p.rpartition("@") if p.rfind("@") > 0 else (p, "", "*")
        deps[name] = ver or "*"
    with open(os.path.join(repo, "package.json"), "w") as f:
        json.dump({"name": "bench-real", "version": "1.0.0", "private": True,
                   "devDependencies": deps}, f, indent=2)
        f.write("\n")
    dep_dirs, dep_note = [], ""
    if shutil.which("npm"):
        log(f"npm install {npm_packages}")
        t = time.perf_counter()
        r = run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
                cwd=repo, env=dict(os.environ), check=False, timeout=1800)
        if r.returncode == 0:
            dep_dirs = ["node_modules"]
            dep_note = f" (npm install took {time.perf_counter() - t:.0f} s)"
        else:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            dep_note = f"; **npm install failed, no node_modules**: {err[-1] if err else r.returncode}"
    else:
        dep_note = "; **npm is not installed, no node_modules**"
    commit_all(repo, "vendored crates, LuaJIT, package.json")
    other, moved = moved_commit(repo, 7)
    base = out(run(["git", "-C", repo, "rev-parse", "main"]))
    ntracked = len(run(["git", "-C", repo, "ls-files", "-z"]).stdout.split(b"\0")) - 1
    ncrates = len(os.listdir(os.path.join(repo, "vendor")))
    nm = sum(len(d) + len(f) for _, d, f in os.walk(os.path.join(repo, "node_modules")))
    build = Build("luajit", ["make", "-j2", "BUILDMODE=static"], ["./luajit/src/luajit", "-e", "x=6*7"],
                  f"`make -j2 BUILDMODE=static` of LuaJIT 2.1 ({top}, from the `{CRATE_NAME}` crate)")
    desc = (f"{ntracked:,} tracked files: `cargo vendor` of octofs's {ncrates} dependency crates{pruned}, "
            f"LuaJIT's sources ({top}), package.json/package-lock.json of `{npm_packages}`; ignored "
            f"`node_modules/` of {nm:,} entries{dep_note}; branch `renamed` moves {moved:,} files")
    return Corpus("real", repo, dep_dirs, base, other, build, desc, ntracked, nm)
