#!/usr/bin/env python3
"""Checks README.md against the built binary (run by scripts/test.sh; stdlib only).

1. Every flag of every subcommand the binary's `--help` lists (clap leaves hidden
   subcommands and hidden flags out of `--help`, so they are exempt) is in the README, and
   so is every subcommand: a flag or command added without documentation fails here.
2. Every section reference in the README's style, `*Section*` (single asterisks, outside
   code), names a heading that exists (`## Section` or `### Section`).

Usage: scripts/check-readme.py [BINARY] [README]
(defaults: target/debug/ringleader and README.md, from the repository root).
Prints each problem and exits 1 if there is any.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def help_text(binary, path):
    """`BINARY PATH... --help`, with the environment's defaults kept out of the text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLEADER_")}
    env["NO_COLOR"] = "1"
    out = subprocess.run(
        [binary, *path, "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"check-readme: `{' '.join([binary, *path, '--help'])}` failed:\n{out.stderr}")
    return out.stdout


def sections(text):
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
    for line in sections(text).get("Commands", []):
        m = re.match(r"^  ([a-z][a-z0-9-]*)(\s|$)", line)
        if m and m.group(1) != "help":
            names.append(m.group(1))
    return names


def flags(text):
    """Long flags (`--name`) of the `Options:` block; `--help`/`--version` are clap's own."""
    found = []
    for line in sections(text).get("Options", []):
        # `  -f, --follow` or `      --peer <PEER>`; deeper lines are wrapped descriptions.
        m = re.match(r"^  (?:-[A-Za-z], |    )(--[a-z0-9][a-z0-9-]*)", line)
        if m and m.group(1) not in ("--help", "--version"):
            found.append(m.group(1))
    return found


def walk(binary):
    """Every (command path, flag) pair, and every command path, of the binary."""
    pairs, commands, todo = [], [], [[]]
    while todo:
        path = todo.pop(0)
        text = help_text(binary, path)
        for flag in flags(text):
            pairs.append((path, flag))
        for sub in subcommands(text):
            commands.append(path + [sub])
            todo.append(path + [sub])
    return pairs, commands


def strip_code(readme):
    """The README without fenced blocks and inline code (for section references)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # keeps line numbers
    readme = re.sub(r"^```.*?^```[^\n]*$", blank, readme, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", readme)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/ringleader")
    readme_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "README.md")
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    problems = []

    pairs, commands = walk(binary)
    if not pairs or not commands:
        sys.exit(f"check-readme: found no flags or commands in `{binary} --help`")
    missing = {}
    for path, flag in pairs:
        if not re.search(re.escape(flag) + r"(?![A-Za-z0-9_-])", readme):
            missing.setdefault(flag, []).append(" ".join(["ringleader", *path]))
    for flag, where in sorted(missing.items()):
        problems.append(f"flag {flag} (of `{'`, `'.join(where)}`) is not in {readme_path}")
    for path in commands:
        # `ringleader token create` in full, or the subcommand in code after its parent
        # (`ringleader dataset add NAME PATH` · `ls [--json]`).
        *parent, name = path
        full = r"ringleader\s+" + r"\s+".join(map(re.escape, path)) + r"(?![A-Za-z0-9_-])"
        short = r"`" + re.escape(name) + r"(?![A-Za-z0-9_-])"
        if not re.search(full, readme) and not (parent and re.search(short, readme)):
            problems.append(f"command `ringleader {' '.join(path)}` is not in {readme_path}")

    prose = strip_code(readme)
    headings = {
        re.sub(r"\s+", " ", m.group(1)).strip()
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose, flags=re.M)
    }
    for m in re.finditer(r"(?<![*\w])\*([^*\s][^*]*?[^*\s]|[^*\s])\*(?![*\w])", prose):
        ref = re.sub(r"\s+", " ", m.group(1))
        if ref not in headings:
            line = prose.count("\n", 0, m.start()) + 1
            problems.append(f"reference *{ref}* (line {line}) names no heading of {readme_path}")

    for p in problems:
        print(f"check-readme: {p}")
    if problems:
        print(f"check-readme: {len(problems)} problem(s)")
        return 1
    print(
        f"check-readme: ok ({len(set(f for _, f in pairs))} flags of {len(commands) + 1} commands, "
        f"{len(headings)} headings)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
