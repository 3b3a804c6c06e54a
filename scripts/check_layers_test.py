#!/usr/bin/env python3
"""Tests of scripts/check-layers.py on a tiny fixture tree (`python3 scripts/check_layers_test.py`,
run by scripts/test.sh): it must name a cycle and an upward import, and pass a clean tree."""

import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("check_layers", os.path.join(HERE, "check-layers.py"))
check_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layers)

DESIGN = """# design

## The node, by part

| part | owns | may use |
| --- | --- | --- |
| `low/` | the bottom | nothing |
| `mid/` | the middle | `low` |
| `top/` | the top | `mid`, `low::a` |
| `cli/` | commands | everything |

## Next
"""

# A crate whose parts follow the table, with no cycle; tests add one file to break it.
CLEAN = {
    "src/lib.rs": "pub mod low;\npub mod mid;\npub mod top;\npub mod cli;\n",
    "src/low/mod.rs": "//! low\npub mod a;\npub mod b;\npub use a::Thing;\n",
    "src/low/a.rs": "pub struct Thing;\nuse super::b::helper;\n",
    "src/low/b.rs": "pub fn helper() {}\n",
    "src/mid.rs": "use crate::low::{a::Thing, b};\npub fn f() -> crate::low::Thing { b::helper(); Thing }\n",
    "src/top.rs": (
        "use crate::{mid::{self, f}, low::a::Thing};\n"
        "// crate::cli::nothing in a comment does not count\n"
        "const S: &str = \"crate::cli::nor in a string\";\n"
        "#[cfg(test)]\nmod tests {\n    use crate::cli::anything;\n}\n"
    ),
    "src/cli.rs": "pub fn run() { crate::top::go(); crate::low::b::helper() }\n",
}


def tree(files):
    root = tempfile.mkdtemp(prefix="check-layers-")
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(root, "design.md"), "w", encoding="utf-8") as f:
        f.write(DESIGN)
    return root


def run(files):
    root = tree(files)
    return check_layers.check(root, crates=[("fx", "src", True)], design="design.md")


class CheckLayers(unittest.TestCase):
    def test_a_clean_tree_passes(self):
        self.assertEqual(run(CLEAN), [])

    def test_a_cycle_between_files_is_named(self):
        files = dict(CLEAN)
        files["src/low/b.rs"] = "pub fn helper() {}\nfn g() { crate::low::a::Thing; }\n"
        msgs = run(files)
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("cycle in fx::low: a → b → a", msgs[0])
        self.assertIn("src/low/b.rs:2 uses crate::low::a::Thing", msgs[0])

    def test_a_cycle_through_a_reexport_and_a_grouped_use_is_named(self):
        files = dict(CLEAN)
        # `crate::low::Thing` is `a::Thing` re-exported by low/mod.rs.
        files["src/low/b.rs"] = "use crate::{\n    low::{Thing as T},\n};\npub fn helper() {}\n"
        msgs = run(files)
        self.assertTrue(any("a → b → a" in m for m in msgs), msgs)

    def test_an_upward_import_is_named(self):
        files = dict(CLEAN)
        files["src/mid.rs"] = CLEAN["src/mid.rs"] + "fn up() { let _ = crate::top::X; }\n"
        msgs = run(files)
        self.assertTrue(any(m.startswith("upward import: mid uses top") and "src/mid.rs:3" in m
                            for m in msgs), msgs)
        # and mid ↔ top is a cycle among the crate's parts as well
        self.assertTrue(any("cycle in fx: mid → top → mid" in m for m in msgs), msgs)

    def test_a_part_outside_its_may_use_list_is_named(self):
        files = dict(CLEAN)
        files["src/mid.rs"] = "use crate::low::a::Thing;\n"
        files["src/top.rs"] = "use crate::low::b::helper;\n"  # may use low::a only… by part: low
        self.assertEqual(run(files), [])
        files["src/cli.rs"] = "pub fn run() {}\n"
        files["src/low/a.rs"] = "pub struct Thing;\nfn f() { super::super::mid::x(); }\n"
        msgs = run(files)
        self.assertTrue(any("upward import: low uses mid" in m for m in msgs), msgs)

    def test_a_parent_naming_its_children_is_not_an_import(self):
        files = dict(CLEAN)
        files["src/low/mod.rs"] = "pub mod a;\npub mod b;\npub fn f() { a::x(); self::b::helper(); }\n"
        files["src/low/a.rs"] = "pub fn x() { super::f() }\npub struct Thing;\n"
        self.assertEqual(run(files), [])

    def test_the_table_must_order_its_parts(self):
        msgs = check_layers.layer_violations(
            check_layers.Crate("fx", tree(CLEAN) + "/src"),
            check_layers.parse_layers(DESIGN.replace("| `low/` | the bottom | nothing |",
                                                     "| `low/` | the bottom | `top` |")))
        self.assertIn("design.md: low may use top, which the table puts above it"[-40:],
                      "\n".join(msgs))

    def test_a_module_missing_from_the_table_is_named(self):
        files = dict(CLEAN)
        files["src/lib.rs"] += "pub mod extra;\n"
        files["src/extra.rs"] = "\n"
        msgs = run(files)
        self.assertEqual(msgs, ["fx: module extra is not a part of the table in design.md"])

    def test_the_allow_list_hides_known_problems_and_names_stale_entries(self):
        files = dict(CLEAN)
        files["src/low/b.rs"] = "pub fn helper() {}\nfn g() { crate::low::a::Thing; }\n"
        msgs = run(files)
        entries, bad = check_layers.allowed(
            "# known\ncycle in fx::low: a → b → a  # b will stop using a\n"
            "upward import: low uses top  # gone already\nno reason here\n")
        self.assertEqual(bad, [f"{check_layers.ALLOWED}:4: an entry needs its reason after '  # '"])
        left = check_layers.unallowed(msgs, entries)
        self.assertEqual(len(left), 2, left)
        self.assertIn("'upward import: low uses top' allows nothing any more", left[0])

    def test_a_part_that_is_a_crate_counts_through_either_path(self):
        # `low` moved into a crate of its own, `ringleader_low`, with `b` at its root too.
        files = {k: v for k, v in CLEAN.items() if not k.startswith("src/low")}
        files["src/lib.rs"] = ("pub use ringleader_low as low;\npub use ringleader_low::{b};\n"
                               "pub mod mid;\npub mod top;\npub mod cli;\n")
        design = DESIGN.replace("| `mid/` | the middle | `low` |",
                                "| `b.rs` | a crate's module | nothing |\n"
                                "| `mid/` | the middle | `low`, `b` |")
        root = tree(files)
        with open(os.path.join(root, "design.md"), "w", encoding="utf-8") as f:
            f.write(design)

        def check():
            return check_layers.check(root, crates=[("fx", "src", True)], design="design.md")

        self.assertEqual(check(), [])
        for line in ("fn g() { ringleader_low::b::helper(); }", "use crate::b::helper;"):
            with open(os.path.join(root, "src/top.rs"), "w", encoding="utf-8") as f:
                f.write(CLEAN["src/top.rs"] + line + "\n")
            msgs = check()
            self.assertEqual(len(msgs), 1, msgs)
            self.assertTrue(msgs[0].startswith("upward import: top uses b (not in its may-use"),
                            msgs)
            self.assertIn("src/top.rs:8 uses " + ("ringleader_low::b::helper" if "ringleader_low"
                                                   in line else "crate::b::helper"), msgs[0])

    def test_a_crate_named_privately_by_a_crate_above_counts_as_its_part(self):
        # `mid` and `top` moved into a crate of their own that names the crate below it at
        # its root without `pub` (`use ringleader_low as low;`), as ringleader-services does.
        files = {
            "up/lib.rs": "use ringleader_low as low;\npub mod mid;\npub mod top;\n",
            "up/mid.rs": CLEAN["src/mid.rs"],
            "up/top.rs": CLEAN["src/top.rs"],
        }
        root = tree(files)

        def check():
            return check_layers.check(root, crates=[("up", "up", True)], design="design.md")

        self.assertEqual(check(), [])
        # `top` may no longer use `low`: its `crate::low::a::Thing` is named.
        with open(os.path.join(root, "design.md"), "w", encoding="utf-8") as f:
            f.write(DESIGN.replace("| `mid`, `low::a` |", "| `mid` |"))
        msgs = check()
        self.assertEqual(len(msgs), 1, msgs)
        self.assertTrue(msgs[0].startswith("upward import: top uses low (not in its may-use"),
                        msgs)
        self.assertIn("up/top.rs:1 uses crate::low::a::Thing", msgs[0])

    def test_a_crate_that_is_one_part_is_held_to_its_row(self):
        # `mid` as a crate of its own (as ringleader-api is `api`): its own modules are not
        # parts; what it imports from the crates below counts against `mid`'s row.
        files = {
            "one/lib.rs": ("use ringleader_low as low;\nuse ringleader_up::top;\n"
                           "mod inner;\nmod more;\n"),
            "one/inner.rs": "use crate::low::a::Thing;\nuse crate::more::x;\n",
            "one/more.rs": "pub fn x() {}\n",
        }
        root = tree(files)

        def check():
            return check_layers.check(root, crates=[("one", "one", "mid")], design="design.md")

        self.assertEqual(check(), [])
        for line, path in (("fn g() { crate::top::go(); }", "crate::top::go"),
                           ("fn g() { ringleader_services::top::go(); }",
                            "ringleader_services::top::go")):
            with open(os.path.join(root, "one/inner.rs"), "w", encoding="utf-8") as f:
                f.write(files["one/inner.rs"] + line + "\n")
            msgs = check()
            self.assertEqual(len(msgs), 1, msgs)
            self.assertTrue(msgs[0].startswith("upward import: mid uses top (above it"), msgs)
            self.assertIn(f"one/inner.rs:3 uses {path}", msgs[0])

    def test_use_trees_expand(self):
        self.assertEqual(
            check_layers.expand_use_tree("crate::{a::{b, c as d}, e, f::{self, g::*}}"),
            ["crate::a::b", "crate::a::c", "crate::e", "crate::f", "crate::f::g::*"])


if __name__ == "__main__":
    unittest.main()
