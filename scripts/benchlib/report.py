"""The markdown report: the machine, the methods, then per corpus a table of ratios against the
native checkout (median, min–max over the runs) and a table of absolute numbers, the
corpus-independent workloads, daemon memory, and every figure where octofs is behind an
alternative. Next to octofs's ratios: the FUSE requests per file behind each figure (total and the
three most frequent opcodes), from the mount's request counters read around every sample."""

import types

from .common import MIB, fmt_b, fmt_ratio, fmt_stat, fmt_t, med
from .figures import CORPUS_FREE, FIGURES

UNITS = {k: u for k, _, u in FIGURES}
LABELS = {k: l for k, l, _ in FIGURES}


# Figures whose ratio is against another figure of the native checkout.
REF = {"read_fill": "read_cold"}

# Request counts with no figure of their own: (label, the figure whose ratio is shown).
REQUEST_ONLY = {"seq": ("sequential write + fsync, then cold and warm reads (per run)", "seq_write")}


def fmt_abs(key, xs):
    return fmt_stat(xs, fmt_b if UNITS[key] == "B" else fmt_t)


def ratio_cell(xs, ref):
    xs = [x for x in xs or [] if x is not None]
    r = med(ref or [])
    if not xs or not r:
        return "—"
    lo, hi = min(xs) / r, max(xs) / r
    m = med(xs) / r
    if len(xs) == 1 or abs(hi - lo) < 0.005:
        return fmt_ratio(m)
    return f"{fmt_ratio(m)} ({fmt_ratio(lo)}–{fmt_ratio(hi)})"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def figure_label(key, corpus, args, res):
    label = LABELS[key]
    if key == "build":
        return f"build: {corpus['build']}"
    if key == "small":
        return f"{label} ({args.small_files:,} files in 100 dirs)"
    if key.startswith("seq"):
        return f"{label} ({args.seq_mib:,} MiB)"
    if key in ("pagecache", "pagecache_all", "pagecache_files"):
        n = next((m.get("pagecache_n") for m in res.values() if isinstance(m, dict) and m.get("pagecache_n")), "N")
        if key == "pagecache_files":
            return (f"page cache held by the files after {n} workspaces read every file (`fincore`: "
                    f"the workspaces' files; octofs: its blob cache, and each no-open mount's own)")
        if key == "pagecache_all":
            return (f"page cache after {n} workspaces read every file (`Cached` + `Buffers` of "
                    f"/proc/meminfo, the whole machine: a checkout's directory blocks are `Buffers`, "
                    f"a FUSE mount's cached listings `Cached`)")
        return f"`Cached` alone after {n} workspaces read every file (the whole machine)"
    return label


def grid(keys, corpus, methods, args, absolute):
    res = corpus["methods"]
    ref = res.get("native", {})
    names = [m for m in methods if m in res and "skipped" not in res[m]]
    rows = []
    for k in keys:
        if not any(res[m].get(k) for m in names):
            continue
        row = [figure_label(k, corpus, args, res)]
        for m in names:
            xs = res[m].get(k)
            row.append(fmt_abs(k, xs) if absolute else
                       ("1.00×" if m == "native" and xs else ratio_cell(xs, ref.get(REF.get(k, k)))))
        rows.append(row)
    return table(["figure"] + names, rows)


def fmt_rq(x):
    if x == 0:
        return "0"
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def per_file(samples, n):
    """Median requests per file over the samples, and the three most frequent opcodes (median per
    file each); None without samples or files."""
    if not samples or not n:
        return None
    total = med([sum(s.values()) / n for s in samples])
    ops = sorted({op for s in samples for op in s})
    per_op = [(med([s.get(op, 0) / n for s in samples]), op) for op in ops]
    top = sorted(per_op, key=lambda x: (-x[0], x[1]))[:3]
    return total, [(v, op) for v, op in top if v > 0]


def octofs_methods(names):
    """The octofs methods of a run (`octofs`, `octofs-noopen`, ...), in the run's order."""
    return [m for m in names if m.startswith("octofs")]


def requests_table(keys, corpus, args, res, files_of, method="octofs"):
    """Requests per file behind an octofs method's figures, next to its ratio against native."""
    o = res.get(method, {})
    rq = o.get("requests") or {}
    ref = res.get("native", {})
    rows = []
    for k in keys:
        pf = per_file(rq.get(k), files_of(k))
        if pf is None:
            continue
        total, top = pf
        label, fig = REQUEST_ONLY.get(k, (None, k))
        label = label or figure_label(k, corpus, args, res)
        rows.append([label, ratio_cell(o.get(fig), ref.get(REF.get(fig, fig))), fmt_rq(total),
                     ", ".join(f"{op} {fmt_rq(v)}" for v, op in top) or "none"])
    if not rows:
        return None
    return table(["figure", f"{method} vs native", "requests per file", "top 3 opcodes (per file)"], rows)


def behind(corpora, methods):
    """Figures where an octofs method's median is more than 10 % above the best alternative's
    (the other octofs methods are not alternatives)."""
    found = []
    for cname, corpus in corpora.items():
        res = corpus["methods"]
        for om in octofs_methods(methods):
            found += behind_one(cname, res, om, methods)
    return found


def behind_one(cname, res, om, methods):
    found = []
    o = res.get(om, {})
    if "skipped" in o:
        return found
    for k, _, _ in FIGURES:
        mo = med(o.get(k) or [])
        if mo is None:
            continue
        alts = [(med(res[m].get(k) or []), m) for m in methods
                if not m.startswith("octofs") and m in res and "skipped" not in res[m]]
        alts = [(v, m) for v, m in alts if v is not None]
        if not alts:
            continue
        best, who = min(alts)
        if mo > best * 1.1 and mo - best > (4096 if UNITS[k] == "B" else 0.002):
            f = fmt_b if UNITS[k] == "B" else fmt_t
            found.append(f"{cname}: {LABELS[k]}: {om} {f(mo)} vs {who} {f(best)} "
                         f"({fmt_ratio(mo / best) if best else '∞'})")
    return found


# The read-side targets: (figure, the highest ratio against native that meets it).
TARGETS = [("read", 1.5), ("stat", 1.3), ("status_cold", 0.7), ("read_cold", 1.3),
           ("status_warm", 0.5), ("pagecache_all", 1.0), ("pagecache_files", 1.0)]


def targets_table(corpora, methods):
    """Each read-side target per corpus and octofs method: the median ratio and whether it is
    met (None when no octofs method has any of those figures)."""
    rows = []
    for k, limit in TARGETS:
        for cname, corpus in corpora.items():
            res = corpus["methods"]
            ref = med(res.get("native", {}).get(k) or [])
            cells = []
            for om in octofs_methods(methods):
                mo = med(res.get(om, {}).get(k) or [])
                if mo is None or not ref:
                    cells.append("—")
                else:
                    r = mo / ref
                    cells.append(f"{fmt_ratio(r)} {'met' if r <= limit else '**not met**'}")
            if any(c != "—" for c in cells):
                rows.append([LABELS[k], f"≤ {limit:g}×", cname] + cells)
    if not rows:
        return None
    return table(["figure", "target", "corpus"] + octofs_methods(methods), rows)


def render(doc):
    args = types.SimpleNamespace(**doc["args"])
    methods = doc["method_names"]
    out = [f"# octofs benchmark: {doc['started']}", ""]
    out.append(f"`{doc['command']}` — {doc['elapsed'] / 60:.0f} min. Every figure is the median of the "
               f"runs, with min–max in brackets; ratios are against the native checkout (1.00×, lower "
               f"is better for every figure). Forks per method: {args.forks}; runs of quick figures "
               f"{args.runs}, of slow ones {args.slow_runs}, builds {args.build_runs}."
               + (f" Only the forks and these stages ran: {', '.join(args.stages)}."
                  if getattr(args, "stages", None) else ""))
    out += [f"\n**Note:** {n}" for n in doc.get("notes", [])]
    out += ["", "## Machine", "", table(["", ""], [[k, v] for k, v in doc["machine"]]), ""]
    out += ["## Methods", ""]
    rows = []
    for name, label, desc in doc["methods"]:
        why = doc["skipped"].get(name)
        rows.append([f"`{name}`", label, desc + (f" — **skipped: {why}**" if why else "")])
    out += [table(["method", "", "what a fork is"], rows), ""]
    keys = [k for k, _, _ in FIGURES if k not in CORPUS_FREE]
    first = None
    for cname, corpus in doc["corpora"].items():
        first = first or corpus
        out += [f"## Corpus `{cname}`", "", corpus["desc"], ""]
        for m, r in corpus["methods"].items():
            if r.get("error"):
                out.append(f"- **{m} stopped early: {r['error']}** (figures before it are kept)")
            for f in r.get("failed", []):
                out.append(f"- **{m} failed a stage**, its figures are missing or partial: {f}")
        out += ["", "Ratios against the native checkout:", "",
                grid(keys, corpus, methods, args, False), "", "Absolute:", "",
                grid(keys, corpus, methods, args, True), ""]
        n = corpus.get("files")
        for om in octofs_methods(methods):
            t = requests_table(keys, corpus, args, corpus["methods"], lambda k: n, om)
            if t:
                out += [f"Requests behind `{om}`'s figures: FUSE requests per file of the workspace "
                        f"({n:,} files: tracked and ignored dependencies), median over the samples "
                        f"(`octofs stats` read before and after each one). Snapshots are written by "
                        f"the daemon itself; their requests are what ran in the mount meanwhile. "
                        f"FORGETs come when the kernel drops inodes, which can be during a later "
                        f"sample.", "", t, ""]
    if first and any(first["methods"].get(m, {}).get(k) for m in methods for k in CORPUS_FREE):
        out += ["## Workloads in the tree (corpus-independent; in the first corpus's workspace)", "",
                grid(CORPUS_FREE, first, methods, args, False), "",
                grid(CORPUS_FREE, first, methods, args, True), ""]
        for om in octofs_methods(methods):
            t = requests_table(("small", "seq"), first, args, first["methods"],
                               lambda k: args.small_files if k == "small" else 1, om)
            if not t:
                continue
            out += [f"Requests behind `{om}`'s figures: per small file ({args.small_files:,}; the "
                    f"count includes the read-back check of every 20th file), and per run of the "
                    f"sequential workload (one file: nearly all its FORGETs are of inodes of earlier "
                    f"figures that the kernel dropped meanwhile).", "", t, ""]
    mem = doc.get("memory") or {}
    if mem:
        out += ["## Daemon memory (RSS) with k workspaces mounted", "",
                "Kernel overlayfs and the copies have no process of their own (0 MiB). fuse-overlayfs runs "
                "one daemon per mount (the sum is shown); octofs one daemon for all.", ""]
        for cname, per in mem.items():
            labels = ["0", "1", "10", "100", "10+status"]
            rows = []
            for m, vals in per.items():
                if "skipped" in vals:
                    rows.append([m] + [f"skipped: {vals['skipped']}"] + [""] * (len(labels) - 1))
                else:
                    rows.append([m] + [f"{vals[l] / MIB:.1f} MiB" if l in vals else "—" for l in labels])
            out += [f"Corpus `{cname}`:", "",
                    table(["method", "no workspace", "1", "10", "100", "10, after `git status` in each"], rows), ""]
    t = targets_table(doc["corpora"], methods)
    if t:
        out += ["## Read-side targets", "",
                "Median ratio against the native checkout of this run (the page cache: N workspaces "
                "against N native checkouts).", "", t, ""]
    b = behind(doc["corpora"], methods)
    out += ["## Where octofs is behind an alternative", ""]
    out += [f"- {x}" for x in b] if b else ["- nowhere by more than 10 %"]
    if doc["errors"]:
        out += ["", "## Errors", ""] + [f"- {e}" for e in doc["errors"]]
    return "\n".join(out) + "\n"
