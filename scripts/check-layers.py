#!/usr/bin/env python3
"""Checks the module structure of the workspace's crates: no import cycle, no upward import.

Run from the repository root (scripts/test.sh does): `python3 scripts/check-layers.py`.
Exits 1 naming every cycle and every upward import it finds, 0 otherwise.

What counts as an import: every `crate::` and `super::` path in a crate's non-test code
(`use` trees, grouped ones such as `use crate::{a, b::{c, d}}` expanded, and inline paths such
as `crate::x::y(...)`), resolved to the file module it names (through `pub use` re-exports).
A parent naming its own children (`mod x;`, `x::f()`, `pub use x::Y`) is not counted: that is
what a parent is for. Code under `#[cfg(test)]` is not counted either (tests may reach
anywhere, as dev-dependencies may).

Cycles: an import from module `a::x` to `a::y::z` is an edge between the siblings `x` and `y`
(children of `a`); every strongly connected set of siblings is a cycle, named with the imports
that make it. So a cycle among the files of one folder is found, and so is one among the
crate's parts (`control` → `jobs` → `control`).

Layers: the node crate's parts and what each may use are the table under "## The node, by
part" in docs/book/src/design/design.md, lowest part first. A part may be a crate of its own
that the node's `lib.rs` re-exports under the part's name (`pub use ringleader_cluster as
cluster;`, `pub use ringleader_cluster::{tasks, data_dir};`): an import of it through the old
path (`crate::cluster::…`) or the crate's (`ringleader_cluster::…`) counts as an import of that
part; so does an import through a crate's private name for a crate below it (`use
ringleader_control as control;` in `ringleader-services`' root), and a path into a crate of
several parts (`ringleader_services::jobs::…`). A crate may hold several parts (the table then
governs the imports among them) or be one part (`ringleader-api`: its imports of other parts
count against that part's row). A part may import only the parts its
"may use" column names (each in backticks, `x/` or `x::…`; "everything" allows all), and a part
may only name parts listed above its own row. The check reads the table itself, so the design
document and the check cannot drift apart.

Problems known and not fixed yet are listed in scripts/layers-allowed.txt, each with its
reason; any other problem fails the check, and so does an entry that no longer occurs.

`python3 scripts/check_layers_test.py` tests this script on a small fixture tree.
"""

import os
import re
import sys
from collections import defaultdict

# The crates checked: (name, source root, how docs/book/src/design/design.md's table governs it:
# True, the parts inside it; a part's name, the crate is that one part, held to its row; False,
# not at all). The node's lowest parts are crates of their own (`cluster`, `tasks` and `data_dir` in
# `ringleader-cluster`, `domain` in `ringleader-domain`, `control` in `ringleader-control`):
# the compiler holds their imports, this script their files' cycles. `ringleader-services`
# holds several parts (gpus, datasets, security, rotation, jobs, search, chief, sim), so the
# table governs the imports among them as it does the node's; `ringleader-api` is the one part
# `api`, its imports of the parts below held to its row.
CRATES = [
    ("node", "node/src", True),
    ("cluster", "node/cluster/src", False),
    ("domain", "node/domain/src", False),
    ("control", "node/control/src", False),
    ("services", "node/services/src", True),
    ("api", "node/api/src", "api"),
    ("bench", "node/bench/src", False),
    ("trainer", "trainer/src", False),
    ("spec", "trainer/spec/src", False),
    ("collective", "collective/src", False),
    ("protocol", "protocol/src", False),
    ("python", "python/src", False),
]
DESIGN = "docs/book/src/design/design.md"
# The crates that hold several parts: a path `ringleader_services::jobs::…` names part `jobs`.
MULTI_PART_CRATES = {"ringleader_services"}
# Problems known and not fixed yet (see `allowed`).
ALLOWED = "scripts/layers-allowed.txt"
TABLE_HEADING = "## The node, by part"
# Re-exports are followed at most this many times (a chain longer than this is a bug).
REEXPORT_HOPS_MAX = 8


# ---------------------------------------------------------------------------------------------
# Reading Rust source


def strip_comments_and_strings(text):
    """Returns `text` with comments removed and string/char literals emptied (same lines)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not (
            i and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    """Index just past the `}` matching the `{` at `open_at`."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def item_end(text, start):
    """Index just past the item starting at `start`: its `;` or its brace-matched body."""
    depth = 0
    for j in range(start, len(text)):
        c = text[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == ";":
            return j + 1
        elif depth == 0 and c == "{":
            return matching_brace(text, j)
    return len(text)


TEST_CFG = re.compile(r"#\[cfg\(([^\]]*)\)\]")


def is_test_cfg(cond):
    return re.search(r"\btest\b", cond) is not None and "not(test" not in cond.replace(" ", "")


def remove_test_items(text):
    """Blanks the items under a `#[cfg(test)]` (keeping newlines); returns the text and the
    names of child modules declared as test-only (`#[cfg(test)] mod x;`)."""
    test_children = set()
    pieces, pos = [], 0
    for m in TEST_CFG.finditer(text):
        if m.start() < pos or not is_test_cfg(m.group(1)):
            continue
        end = item_end(text, m.end())
        decl = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;",
                        text[m.end():end])
        if decl:
            test_children.add(decl.group(1))
        pieces.append(text[pos:m.start()])
        pieces.append("\n" * text.count("\n", m.start(), end))
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces), test_children


def expand_use_tree(tree):
    """`a::{b, c::{d, e as f}, self}` → ['a::b', 'a::c::d', 'a::c::e', 'a']."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    out = []

    def walk(prefix, t):
        # Split t at top-level commas.
        parts, depth, cur = [], 0, ""
        for ch in t:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if not p:
                continue
            k = p.find("{")
            if k >= 0:
                walk(prefix + p[:k], p[k + 1:p.rfind("}")])
            elif p == "self":
                out.append(prefix.rstrip(":"))
            else:
                out.append(prefix + p)

    walk("", tree)
    return out


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")
# A path from the crate's root, its parent or itself, or from one of the node's own crates.
PATH = re.compile(r"(?<![\w$:])(crate|super|self|ringleader_\w+)((?:\s*::\s*(?:\w+|\*))+)")
# `pub use ringleader_x as part;` in a crate's root: a part that is a crate of its own.
CRATE_PART = re.compile(r"^(ringleader_\w+)\s+as\s+(\w+)$")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def file_paths(text):
    """Yields (line, path, is_pub_use, inline module stack) for every path in `text`, and
    the stack of inline modules each sits in. Paths of `use` trees come expanded."""
    # Inline modules: where each opens and closes, to resolve `super::` inside them.
    spans = []
    for m in INLINE_MOD.finditer(text):
        spans.append((m.start(), matching_brace(text, m.end() - 1), m.group(1)))

    def stack_at(pos):
        return [name for (s, e, name) in spans if s < pos < e]

    use_spans = []
    for m in USE.finditer(text):
        use_spans.append((m.start(), m.end()))
        line = text.count("\n", 0, m.start()) + 1
        for p in expand_use_tree(m.group(2)):
            yield line, p, bool(m.group(1)), stack_at(m.start())
    for m in PATH.finditer(text):
        if any(s <= m.start() < e for (s, e) in use_spans):
            continue
        line = text.count("\n", 0, m.start()) + 1
        yield line, m.group(1) + re.sub(r"\s+", "", m.group(2)), False, stack_at(m.start())


# ---------------------------------------------------------------------------------------------
# A crate's modules


class Crate:
    """The file modules of one crate: module path (a tuple) → its file and its imports."""

    def __init__(self, name, root):
        self.name = name
        self.root = root
        self.files = {}  # module path → file path
        self.texts = {}
        self.test_only = set()
        # A path into another of the node's crates → the part it is re-exported as.
        self.crate_parts = {}
        lib = os.path.join(root, "lib.rs")
        if os.path.exists(lib):
            self._load((), lib)
            self._load_crate_parts()

    def _load_crate_parts(self):
        """The parts the root names from other crates (`pub use ringleader_x as part;`,
        `pub use ringleader_x::{a, b};`, or the same without `pub`, as a crate above the lowest
        names the crates below it), each a module with no file of this crate's."""
        for m in USE.finditer(self.texts[()]):
            tree = re.sub(r"\s+", " ", m.group(2)).strip()
            whole = CRATE_PART.match(tree)
            if whole:
                found = [((whole.group(1),), whole.group(2))]
            else:
                found = [(tuple(p.split("::")), p.split("::")[-1])
                         for p in expand_use_tree(tree) if p.startswith("ringleader_")]
            for path, part in found:
                self.crate_parts[path] = (part,)
                self.files[(part,)] = f"{'::'.join(path)} (a crate)"
                self.texts[(part,)] = ""

    def crate_part(self, path):
        """The part that a path into another of the node's crates names, or None."""
        segs = path.split("::")
        for k in range(len(segs), 0, -1):
            if tuple(segs[:k]) in self.crate_parts:
                return self.crate_parts[tuple(segs[:k])]
        if segs[0] in MULTI_PART_CRATES and len(segs) > 1:
            return (segs[1],)
        return None


    def _load(self, mod, path):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        text, test_children = remove_test_items(strip_comments_and_strings(raw))
        self.files[mod] = path
        self.texts[mod] = text
        folder = os.path.dirname(path) if os.path.basename(path) in ("lib.rs", "mod.rs") \
            else os.path.splitext(path)[0]
        for m in re.finditer(r"\bmod\s+(\w+)\s*;", text):
            child = m.group(1)
            for cand in (os.path.join(folder, child + ".rs"),
                         os.path.join(folder, child, "mod.rs")):
                if os.path.exists(cand):
                    self._load(mod + (child,), cand)
                    break
        for child in test_children:
            self.test_only.add(mod + (child,))

    def resolve_start(self, mod, stack, path):
        """The absolute segments of `path` written in module `mod` (inside `stack`)."""
        segs = path.split("::")
        if segs[0] == "crate":
            return list(segs[1:])
        here = list(mod) + list(stack)
        if segs[0] == "self":
            return here + segs[1:]
        while segs and segs[0] == "super":
            here = here[:-1]
            segs = segs[1:]
        return here + segs

    def reexports(self, mod):
        """Item name → absolute path, for the `pub use` items of module `mod`."""
        if not hasattr(self, "_reexports"):
            self._reexports = {}
        if mod not in self._reexports:
            found = {}
            for line, p, is_pub, stack in file_paths(self.texts[mod]):
                if not is_pub or stack:
                    continue
                segs = p.split("::")
                if segs[0] not in ("crate", "super", "self"):
                    segs = ["self"] + segs  # a child's item
                absolute = self.resolve_start(mod, [], "::".join(segs))
                if absolute and absolute[-1] != "*":
                    found[absolute[-1]] = absolute
            self._reexports[mod] = found
        return self._reexports[mod]

    def file_module(self, segs):
        """The file module a path names: its longest prefix that is a file, followed through
        `pub use` re-exports of the item right after it."""
        for _ in range(REEXPORT_HOPS_MAX):
            k = len(segs)
            while k > 0 and tuple(segs[:k]) not in self.files:
                k -= 1
            mod = tuple(segs[:k])
            rest = segs[k:]
            if rest and rest[0] != "*" and mod in self.files:
                target = self.reexports(mod).get(rest[0])
                if target and target[:len(mod)] != list(mod) or (
                        target and len(target) > len(mod) + 1):
                    segs = target + rest[1:]
                    continue
            return mod
        return mod

    def imports(self):
        """Yields (from module, to module, file, line, path) for each counted import."""
        for mod, text in self.texts.items():
            if mod in self.test_only or any(mod[:i] in self.test_only for i in range(len(mod))):
                continue
            for line, p, is_pub, stack in file_paths(text):
                if p.startswith("ringleader_"):
                    target = self.crate_part(p)
                    if target is None or mod == ():
                        continue  # another crate that is no part, or the root re-exporting
                    yield mod, target, self.files[mod], line, p
                    continue
                segs = self.resolve_start(mod, stack, p)
                target = self.file_module(segs)
                if target == mod or mod[:len(target)] == target or target[:len(mod)] == mod:
                    continue  # itself, an ancestor, or its own descendant
                yield mod, target, self.files[mod], line, p


def sibling_edges(crate):
    """(parent, a, b) → the imports making child `a` of `parent` use its sibling `b`."""
    edges = defaultdict(list)
    for src, dst, file, line, path in crate.imports():
        k = 0
        while k < min(len(src), len(dst)) and src[k] == dst[k]:
            k += 1
        if k >= len(src) or k >= len(dst):
            continue
        edges[(src[:k], src[k], dst[k])].append((file, line, path))
    return edges


def strongly_connected(nodes, succ):
    """Tarjan's algorithm; returns the components with more than one node."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def find_cycle(comp, succ):
    """One cycle through the component's first node, as a list of nodes."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(succ.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp + [start]


def cycles(crate):
    """Messages naming each cycle among siblings, with one import per edge."""
    edges = sibling_edges(crate)
    by_parent = defaultdict(lambda: defaultdict(set))
    for (parent, a, b) in edges:
        by_parent[parent][a].add(b)
    msgs = []
    for parent in sorted(by_parent):
        succ = by_parent[parent]
        nodes = set(succ) | {b for bs in succ.values() for b in bs}
        for comp in strongly_connected(nodes, succ):
            cyc = find_cycle(comp, succ)
            where = "::".join((crate.name,) + parent)
            lines = [f"cycle in {where}: {' → '.join(cyc)}"
                     + (f" (all of {', '.join(comp)} depend on each other)"
                        if len(comp) > len(cyc) - 1 else "")]
            inside = sorted((a, b) for a in comp for b in succ.get(a, ()) if b in comp)
            for a, b in inside:
                file, line, path = edges[(parent, a, b)][0]
                more = len(edges[(parent, a, b)]) - 1
                lines.append(f"    {a} → {b}: {file}:{line} uses {path}"
                             + (f" (and {more} more)" if more else ""))
            msgs.append("\n".join(lines))
    return msgs


# ---------------------------------------------------------------------------------------------
# The layer table


def parse_layers(design_text):
    """The parts of docs/book/src/design/design.md's table, lowest first: [(part, may_use set or
    None)] (None: everything). Raises ValueError when the table is missing or malformed."""
    at = design_text.find(TABLE_HEADING)
    if at < 0:
        raise ValueError(f"{DESIGN}: no heading {TABLE_HEADING!r}")
    rows = []
    for line in design_text[at:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        if not line.startswith("|") or re.match(r"\|\s*-", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "part":
            continue
        if len(cells) < 3:
            raise ValueError(f"{DESIGN}: table row with fewer than 3 cells: {line!r}")
        m = re.fullmatch(r"`([\w]+)(?:/|\.rs)?`", cells[0])
        if not m:
            raise ValueError(f"{DESIGN}: first cell is not a `part/`: {cells[0]!r}")
        may = cells[-1]
        if re.search(r"\beverything\b", may):
            rows.append((m.group(1), None))
        else:
            names = {re.split(r"::|/", n)[0] for n in re.findall(r"`([^`]+)`", may)}
            rows.append((m.group(1), names))
    if not rows:
        raise ValueError(f"{DESIGN}: the table under {TABLE_HEADING!r} has no rows")
    return rows


def layer_violations(crate, rows, design=DESIGN, whole=None):
    """Messages naming each import of a part that the table does not let its importer use,
    and each table row that names a part at or above its own. With `whole`, the crate is that
    one part: only its imports of other parts count, each against `whole`'s row."""
    order = {part: i for i, (part, _) in enumerate(rows)}
    allowed = dict(rows)
    msgs = []
    for part, may in rows:
        for other in sorted(may or ()):
            if other not in order:
                msgs.append(f"{design}: {part} may use {other}, which is not a part of the table")
            elif order[other] >= order[part]:
                msgs.append(f"{design}: {part} may use {other}, which the table puts above it")
    tops = {mod[0] for mod in crate.files if mod} if whole is None else set()
    if whole is not None and whole not in order:
        msgs.append(f"{crate.name}: part {whole} is not a part of the table in {design}")
        return msgs
    for top in sorted(tops - set(order)):
        msgs.append(f"{crate.name}: module {top} is not a part of the table in {design}")
    seen = set()
    for src, dst, file, line, path in crate.imports():
        if whole is not None:
            if not path.startswith("ringleader_") and dst[:1] not in crate.crate_parts.values():
                continue  # the part's own files
            src = (whole,)
        if not src or not dst or src[0] == dst[0]:
            continue
        a, b = src[0], dst[0]
        if a not in order or b not in order:
            continue
        may = allowed[a]
        if may is not None and b in may and order[b] < order[a]:
            continue
        if may is None and order[b] < order[a]:
            continue
        why = "above it" if order[b] >= order[a] else "not in its may-use list"
        key = (a, b, file)
        if key in seen:
            continue
        seen.add(key)
        msgs.append(f"upward import: {a} uses {b} ({why} in {design}): {file}:{line} uses {path}")
    return msgs


def check(repo, crates=CRATES, design=DESIGN):
    """All problems found in the repository at `repo`, as messages."""
    msgs = []
    rows = None
    for name, root, layered in crates:
        root = os.path.join(repo, root)
        if not os.path.exists(os.path.join(root, "lib.rs")):
            continue
        crate = Crate(name, root)
        msgs += cycles(crate)
        if layered:
            if rows is None:
                with open(os.path.join(repo, design), encoding="utf-8") as f:
                    try:
                        rows = parse_layers(f.read())
                    except ValueError as e:
                        msgs.append(str(e))
                        continue
            msgs += layer_violations(crate, rows, design,
                                     layered if isinstance(layered, str) else None)
    return msgs


def allowed(text):
    """The entries of an allow list: one a line, the start of a problem's first line, then
    `  # why` (required: an entry without its reason is itself a problem)."""
    entries, bad = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        entry, sep, why = line.partition("  # ")
        if not sep or not why.strip():
            bad.append(f"{ALLOWED}:{n}: an entry needs its reason after '  # '")
        entries.append(entry.strip())
    return entries, bad


def unallowed(msgs, entries):
    """The problems no entry allows, and the entries that allow nothing (stale)."""
    left = [m for m in msgs if not any(m.startswith(e) for e in entries)]
    stale = [f"{ALLOWED}: {e!r} allows nothing any more: delete it"
             for e in entries if not any(m.startswith(e) for m in msgs)]
    return left + stale


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    msgs = check(repo)
    path = os.path.join(repo, ALLOWED)
    entries = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            entries, bad = allowed(f.read())
        msgs = unallowed(msgs, entries) + bad
    for m in msgs:
        print(m)
    if msgs:
        print(f"check-layers: {len(msgs)} problem(s)")
        return 1
    known = f" beyond the {len(entries)} known in {ALLOWED}" if entries else ""
    print(f"check-layers: no cycle, no upward import{known}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
