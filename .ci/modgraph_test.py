#!/usr/bin/env python3
"""Tests of .ci/modgraph.py on small crates written to a temp dir: python3 .ci/modgraph_test.py"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modgraph  # noqa: E402


def crate(files):
    """Writes {relative path: text} under a temp src/ and returns the checked cycles."""
    d = tempfile.mkdtemp()
    for rel, text in files.items():
        p = os.path.join(d, "src", rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    c = modgraph.Crate(os.path.join(d, "src"))
    c.build()
    return [("::".join(level), comp) for level, comp, _, _ in c.cycles()]


class Cycles(unittest.TestCase):
    def test_two_siblings_importing_each_other(self):
        got = crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::Y;\npub struct X;\n",
            "b.rs": "pub struct Y;\nfn f() { let _ = crate::a::X; }\n",
        })
        self.assertEqual(got, [("", ["a", "b"])])

    def test_three_module_ring(self):
        got = crate({
            "lib.rs": "mod a;\nmod b;\nmod c;\n",
            "a.rs": "use crate::b::B;\n",
            "b.rs": "use crate::c::C;\n",
            "c.rs": "use crate::a::A;\n",
        })
        self.assertEqual(got, [("", ["a", "b", "c"])])

    def test_a_parent_presenting_its_children_is_no_cycle(self):
        got = crate({
            "lib.rs": "pub mod tx;\npub use tx::Sender;\n",
            "tx/mod.rs": "mod zerocopy;\npub use zerocopy::Sender;\npub struct Path;\n",
            "tx/zerocopy.rs": "use super::Path;\npub struct Sender(Path);\n",
        })
        self.assertEqual(got, [])

    def test_a_parent_calling_a_child_that_uses_the_parent_is_a_cycle(self):
        got = crate({
            "lib.rs": "pub mod tx;\n",
            "tx/mod.rs": "mod copy;\npub trait T { fn f() { copy::send(); } }\n",
            "tx/copy.rs": "impl super::T for X {}\npub fn send() {}\n",
        })
        self.assertEqual(got, [("tx", ["copy", "self"])])

    def test_test_modules_comments_and_strings_are_ignored(self):
        got = crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::Y;\n",
            "b.rs": (
                "// crate::a::X in a comment\n/* nested /* crate::a::X */ */\n"
                "const S: &str = \"crate::a::X\";\nconst R: &str = r#\"crate::a::X\"#;\n"
                "#[cfg(test)]\nmod tests {\n    use crate::a::X;\n}\n"
            ),
        })
        self.assertEqual(got, [])

    def test_nested_use_groups_resolve_each_leaf(self):
        got = crate({
            "lib.rs": "mod a;\nmod e;\n",
            "a/mod.rs": "pub mod c;\n",
            "a/c.rs": "use crate::e::E;\n",
            "e.rs": "use crate::{a::{c::D}, e as _};\n",
        })
        self.assertEqual(got, [("", ["a", "e"])])

    def test_a_cycle_between_siblings_is_named_at_its_level(self):
        got = crate({
            "main.rs": "mod bench;\n",
            "bench/mod.rs": "mod client;\nmod udp;\n",
            "bench/client.rs": "use super::udp;\n",
            "bench/udp.rs": "use super::client;\n",
        })
        self.assertEqual(got, [("bench", ["client", "udp"])])

    def test_a_reexported_name_resolves_to_its_home(self):
        got = crate({
            "lib.rs": "mod stats;\nmod tx;\npub use tx::TxPath;\n",
            "stats.rs": "use crate::TxPath;\npub struct Stats;\n",
            "tx.rs": "use crate::stats::Stats;\npub enum TxPath {}\n",
        })
        self.assertEqual(got, [("", ["stats", "tx"])])


if __name__ == "__main__":
    unittest.main()
