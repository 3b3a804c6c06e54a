#!/usr/bin/env python3
"""Checks the book (docs/book/src) and the README against the code (run by scripts/test.sh;
stdlib only).

1. The CLI reference (reference/cli.md) against the built binary: every subcommand the
   binary's `--help` lists (clap leaves hidden subcommands and hidden flags out of `--help`,
   so they are exempt) has its section there, a heading `ringleader PATH` or its full name
   `ringleader PATH` in the section of its nearest parent with a heading, and every flag of
   its `--help` is named in that section. The page's text before its first `ringleader …`
   heading is the top-level command's section (the global flags, which clap repeats in
   every subcommand's `--help` and which are checked there only).
2. The spec reference (reference/spec.md) against the spec's keys, read from the sources
   that define them: the serde fields of the structs of node/domain/src/spec/sections.rs
   (the top level, `[resources]`, `[elastic]`, `[preemption]`, `[[files]]`), the serde fields of the structs of
   trainer/spec/src/search/spec/text.rs (`[search]`, `[[search.params]]`), and the serde fields
   of the trainer's table structs in trainer/spec/src/train.rs (`[model]`, `[data]`,
   `[train]`, `[checkpoint]`: each `pub NAME:` of the struct `TrainSpec` names for the table,
   less those marked `#[serde(skip)]`). Each key must be on the page in code, `` `key` `` or
   `` `table.key` `` or `` `[table] key` ``, or as a TOML line `key = …` in a code block.
3. Links: every relative link and image of every page of the book and of the README
   (`[text](path#anchor)`, outside code) leads to a file that exists, a page's link stays
   inside the book's src/ (mdBook copies nothing else), and an anchor names a heading of
   its page (mdBook's and GitHub's ids: lowercase, spaces to `-`, other punctuation
   dropped, a repeated id suffixed `-1`, `-2`, …). Every `{{#include FILE}}` exists, every
   page of SUMMARY.md exists, and every page under src/ is in SUMMARY.md.

Usage: scripts/check-book.py [BINARY | --no-cli]
(default target/debug/ringleader, from the repository root; `--no-cli` leaves part 1 out).
Prints each problem and exits 1 if there is any.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOK = "docs/book/src"
CLI_PAGE = f"{BOOK}/reference/cli.md"
SPEC_PAGE = f"{BOOK}/reference/spec.md"
README = "README.md"
SEARCH_RS = "trainer/spec/src/search/spec/text.rs"
TRAIN_RS = "trainer/spec/src/train.rs"
SECTIONS_RS = "node/domain/src/spec/sections.rs"
# The serde structs of SECTIONS_RS and SEARCH_RS: the table each one's fields are the keys of.
SECTION_STRUCTS = {"SpecText": "", "ResourcesText": "resources", "ElasticText": "elastic",
                   "PreemptionText": "preemption", "FileText": "files"}
SEARCH_STRUCTS = {"SearchText": "search", "ParamText": "search.params"}


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


# --- 1. the CLI reference --------------------------------------------------------------


def help_text(binary, path):
    """`BINARY PATH... --help`, with the environment's defaults kept out of the text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLEADER_")}
    env["NO_COLOR"] = "1"
    out = subprocess.run(
        [binary, *path, "--help"], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        sys.exit(f"check-book: `{' '.join([binary, *path, '--help'])}` failed:\n{out.stderr}")
    return out.stdout


def help_blocks(text):
    """The help's blocks by heading (`Commands:`, `Options:`, …) → their lines."""
    blocks, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^([A-Z][A-Za-z ]*):\s*$", line)
        if m:
            current = m.group(1)
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line)
    return blocks


def subcommands(text):
    names = []
    for line in help_blocks(text).get("Commands", []):
        m = re.match(r"^  ([a-z][a-z0-9-]*)(\s|$)", line)
        if m and m.group(1) != "help":
            names.append(m.group(1))
    return names


def flags(text):
    """Long flags (`--name`) of the `Options:` block; `--help`/`--version` are clap's own."""
    found = []
    for line in help_blocks(text).get("Options", []):
        # `  -f, --follow` or `      --peer <PEER>`; deeper lines are wrapped descriptions.
        m = re.match(r"^  (?:-[A-Za-z], |    )(--[a-z0-9][a-z0-9-]*)", line)
        if m and m.group(1) not in ("--help", "--version"):
            found.append(m.group(1))
    return found


def walk(binary):
    """{command path (tuple): its flags}, the top level's included as ()."""
    commands, todo = {}, [()]
    while todo:
        path = todo.pop(0)
        text = help_text(binary, list(path))
        commands[path] = flags(text)
        todo += [path + (sub,) for sub in subcommands(text)]
    return commands


def cli_sections(page):
    """{command path: its section's text}; () is the text before the first command heading."""
    sections, path, start = {}, (), 0
    for m in re.finditer(r"^#{2,6}\s+`?ringleader((?:\s+[a-z][a-z0-9-]*)+)`?\s*$", page, re.M):
        sections[path] = page[start:m.start()]
        path, start = tuple(m.group(1).split()), m.end()
    sections[path] = page[start:]
    return sections


def check_cli(binary):
    page = read(CLI_PAGE)
    sections = cli_sections(page)
    commands = walk(binary)
    if len(commands) < 2 or not commands[()]:
        sys.exit(f"check-book: found no flags or commands in `{binary} --help`")
    problems, global_flags = [], set(commands[()])
    for path, path_flags in sorted(commands.items()):
        home = max((p for p in sections if path[: len(p)] == p), key=len)
        text = sections[home]
        name = " ".join(("ringleader",) + path)
        if path and home != path:
            full = r"ringleader\s+" + r"\s+".join(map(re.escape, path)) + r"(?![\w-])"
            if not re.search(full, text):
                problems.append(f"command `{name}` has no section in {CLI_PAGE}")
                continue
        where = f"the section of `{' '.join(('ringleader',) + home)}`" if home else "the page's top"
        for flag in path_flags:
            if path and flag in global_flags:
                continue
            if not re.search(re.escape(flag) + r"(?![\w-])", text):
                problems.append(f"flag {flag} of `{name}` is not in {where} of {CLI_PAGE}")
    n_flags = len({f for fl in commands.values() for f in fl})
    return problems, f"{n_flags} flags of {len(commands)} commands"


# --- 2. the spec reference -------------------------------------------------------------


def string_array(body):
    return re.findall(r'"([^"]+)"', body)


def spec_keys():
    """Every key a job spec may hold, as (table, key); table "" is the top level."""
    keys = []
    for path, structs in ((SECTIONS_RS, SECTION_STRUCTS), (SEARCH_RS, SEARCH_STRUCTS)):
        keys += text_struct_keys(path, structs)
    train_rs = read(TRAIN_RS)
    for table, struct in struct_fields(train_rs, "TrainSpec"):
        keys += [(table, k) for k, _ in struct_fields(train_rs, struct)]
    return keys


def text_struct_keys(path, structs):
    """(table, key) of each serde field of the `pub(super) struct`s `structs` of `path` (a
    field's key is its name, or its `#[serde(rename = "...")]`)."""
    source, keys = read(path), []
    for struct, table in structs.items():
        m = re.search(r"pub\(super\) struct " + struct + r" \{(.*?)\n\}", source, re.S)
        if not m:
            sys.exit(f"check-book: {path}: no `struct {struct}`")
        rename = None
        for line in m.group(1).splitlines():
            r = re.search(r'#\[serde\(rename = "(\w+)"\)\]', line)
            if r:
                rename = r.group(1)
            f = re.match(r"\s*pub\(super\) (\w+):", line)
            if f:
                keys.append((table, rename or f.group(1)))
                rename = None
    return keys


def struct_fields(source, struct):
    """(field name, type) of `pub struct STRUCT`'s serde fields (not `#[serde(skip)]`)."""
    m = re.search(r"pub struct " + struct + r" \{(.*?)\n\}", source, re.S)
    if not m:
        sys.exit(f"check-book: {TRAIN_RS}: no `pub struct {struct}`")
    fields, skip = [], False
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith("#[serde(") and re.search(r"\bskip\b", line):
            skip = True
        f = re.match(r"pub (\w+): ([\w:<>]+),", line)
        if f:
            if not skip:
                fields.append((f.group(1), f.group(2)))
            skip = False
    return fields


def check_spec():
    page = read(SPEC_PAGE)
    keys = spec_keys()
    if len(keys) < 60:
        sys.exit(f"check-book: read only {len(keys)} spec keys from the sources: fix the parsing")
    code = " ".join(re.findall(r"`([^`\n]+)`", page))
    toml_lines = {
        m.group(1)
        for block in re.findall(r"^```.*?^```", page, re.S | re.M)
        for m in re.finditer(r"^#?\s*([a-z_0-9]+)\s*=", block, re.M)
    }
    problems = []
    for table, key in keys:
        spelled = [key, f"{table}.{key}", f"[{table}] {key}"] if table else [key]
        in_code = any(re.search(r"(?<![\w.\]-])" + re.escape(s) + r"(?![\w-])", code) for s in spelled)
        if not in_code and key not in toml_lines:
            problems.append(f"spec key {table + '.' if table else ''}{key} is not in {SPEC_PAGE}")
    return problems, f"{len(keys)} spec keys"


# --- 3. links --------------------------------------------------------------------------


def strip_code(text):
    """The text without fenced blocks and inline code, lines kept where they were."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = re.sub(r"^ *```.*?^ *```[^\n]*$", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def heading_ids(text):
    """The anchors of a page's headings, as mdBook (and GitHub) make them."""
    ids, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", strip_fences(text), re.M):
        title = re.sub(r"<[^>]+>", "", m.group(1))
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        base = "".join(
            c.lower() if c.isalnum() or c in "_-" else "-" if c.isspace() else ""
            for c in title
        )
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def strip_fences(text):
    return re.sub(r"^ *```.*?^ *```[^\n]*$", "", text, flags=re.S | re.M)


def links(text):
    """(line, target) of every inline link and image outside code."""
    prose = strip_code(text)
    for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose):
        yield prose.count("\n", 0, m.start()) + 1, m.group(1)


def check_links(files):
    problems, n = [], 0
    book = os.path.join(ROOT, BOOK)
    for rel in files:
        text = read(rel)
        here = os.path.dirname(os.path.join(ROOT, rel))
        in_book = rel.startswith(BOOK + "/")
        for line, target in links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
                continue
            n += 1
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, rel)
            where = f"{rel}:{line}: link {target}"
            if not os.path.exists(full):
                problems.append(f"{where} leads to no file")
                continue
            if in_book and not os.path.realpath(full).startswith(os.path.realpath(book) + os.sep) \
                    and not full.startswith(book + os.sep):
                problems.append(f"{where} leaves the book's src/ (mdBook copies nothing else)")
                continue
            if anchor and full.endswith(".md"):
                with open(full, encoding="utf-8") as f:
                    if anchor not in heading_ids(f.read()):
                        problems.append(f"{where}: #{anchor} names no heading of {os.path.relpath(full, ROOT)}")
        for m in re.finditer(r"\{\{#include\s+([^}\s:]+)[^}]*\}\}", text):
            if not os.path.exists(os.path.normpath(os.path.join(here, m.group(1)))):
                problems.append(f"{rel}: {{{{#include {m.group(1)}}}}} leads to no file")
    return problems, n


def check_summary():
    summary = read(f"{BOOK}/SUMMARY.md")
    listed = {os.path.normpath(t) for _, t in links(summary)}
    problems = [f"{BOOK}/SUMMARY.md lists {p}, which does not exist"
                for p in sorted(listed) if not os.path.exists(os.path.join(ROOT, BOOK, p))]
    pages = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, BOOK)):
        for name in names:
            if name.endswith(".md"):
                page = os.path.relpath(os.path.join(dirpath, name), os.path.join(ROOT, BOOK))
                pages.append(page)
                if page != "SUMMARY.md" and page not in listed:
                    problems.append(f"{BOOK}/{page} is not in SUMMARY.md (mdBook would not build it)")
    return problems, sorted(pages)


def main():
    arg = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/ringleader")
    problems, said = [], []
    if arg != "--no-cli":
        p, what = check_cli(arg)
        problems += p
        said.append(what)
    p, what = check_spec()
    problems += p
    said.append(what)
    p, pages = check_summary()
    problems += p
    p, n = check_links([README] + [f"{BOOK}/{page}" for page in pages])
    problems += p
    said.append(f"{n} links of {len(pages) + 1} pages")
    for problem in problems:
        print(f"check-book: {problem}")
    if problems:
        print(f"check-book: {len(problems)} problem(s)")
        return 1
    print(f"check-book: ok ({', '.join(said)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
