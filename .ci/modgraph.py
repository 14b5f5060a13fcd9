#!/usr/bin/env python3
"""Fails when modules of a Rust crate import each other in a circle.

Usage: python3 .ci/modgraph.py [CRATE_DIR ...]   (default: every crates/*/ with a src/)

What counts. The module tree comes from the files: src/lib.rs or src/main.rs is the root,
foo.rs or foo/mod.rs a module. A *reference* is a path in code (comments, strings and
`#[cfg(test)]` items are ignored: a test may build fixtures from anywhere) that starts with
`crate::`, `super::` or `self::`, in a `use` (nested groups included) or inline. It
resolves to the deepest module it names; a name re-exported by `pub use` resolves to the
module it came from.

The check runs at every level of the tree. For a module M, the nodes are M's children (each
standing for its whole subtree) and M itself (the items of M's own file). An edge runs from
one node to another when code in the first references the second. M's own `mod x;` and
`pub use x::...` lines are how a parent presents its children, not a dependency, and are
not edges. Every strongly connected component of more than one node is a cycle: the
output names the level, the modules, and one reference per edge.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip_code(text):
    """Blanks comments and string/char literals, keeping line structure."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (
                i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_items(code):
    """Blanks every item under #[cfg(test)] (a `mod tests { ... }` block or one item)."""
    out = code
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", code))):
        start = m.start()
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if semi >= 0 and (brace < 0 or semi < brace):
            end = semi + 1
        else:
            depth, j = 0, brace
            while j < len(code):
                if code[j] == "{":
                    depth += 1
                elif code[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            end = j + 1
        out = out[:start] + re.sub(r"[^\n]", " ", out[start:end]) + out[end:]
    return out


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path tuple -> (file, code, raw lines)
        root = next((f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))), None)
        if root:
            self._load((), os.path.join(src, root), src)

    def _load(self, mod, path, dirpath):
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        code = drop_test_items(strip_code(raw))
        self.files[mod] = (path, code, raw.split("\n"))
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", code, re.M):
            name = m.group(1)
            for cand, sub in ((os.path.join(dirpath, name + ".rs"), os.path.join(dirpath, name)),
                              (os.path.join(dirpath, name, "mod.rs"), os.path.join(dirpath, name))):
                if os.path.exists(cand):
                    self._load(mod + (name,), cand, sub)
                    break

    def resolve(self, mod, segs):
        """The module a path names (deepest known prefix), from inside module `mod`."""
        if not segs:
            return None
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base, rest = mod, segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        else:
            return None
        cur = base
        for s in rest:
            if cur + (s,) in self.files:
                cur = cur + (s,)
            else:
                src = self.reexports.get(cur, {}).get(s)
                if src is not None:
                    return src
                break
        return cur

    def uses(self, mod, code):
        """(line, segs, is_reexport) for every path in `code` (the file of `mod`)."""
        found = []
        for m in re.finditer(r"(?:^|\n)([ \t]*(pub(?:\([^)]*\))?\s+)?use\s+)([^;]*);", code):
            line = code.count("\n", 0, m.start(3)) + 1
            for segs in expand(m.group(3)):
                found.append((line, segs, bool(m.group(2))))
        nouse = re.sub(r"(?:^|\n)[ \t]*(pub(?:\([^)]*\))?\s+)?use\s+[^;]*;", lambda x: re.sub(r"[^\n]", " ", x.group(0)), code)
        for m in re.finditer(r"(?<![A-Za-z0-9_:])([a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+", nouse):
            segs = m.group(0).split("::")
            if segs[0] in ("crate", "super", "self") or mod + (segs[0],) in self.files:
                line = nouse.count("\n", 0, m.start()) + 1
                found.append((line, segs, False))
        return found

    def build(self):
        # Re-exports first, so `crate::Foo` resolves to Foo's home.
        self.reexports = {}
        for _ in range(3):
            for mod, (_, code, _) in self.files.items():
                for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([^;]*);", code):
                    for segs in expand(m.group(1)):
                        if segs[0] not in ("crate", "self", "super") and mod + (segs[0],) in self.files:
                            segs = ["self"] + segs
                        target = self.resolve(mod, segs[:-1] if len(segs) > 1 else segs)
                        name = segs[-1].split(" as ")[-1].strip()
                        if target is not None and name not in ("*", "self"):
                            if target + (name,) not in self.files:
                                self.reexports.setdefault(mod, {})[name] = target
        self.edges = []  # (from module, to module, file, line, text)
        for mod, (path, code, lines) in self.files.items():
            for line, segs, presenting in self.uses(mod, code):
                if segs[0] not in ("crate", "super", "self") and mod + (segs[0],) in self.files:
                    segs = ["self"] + segs  # 2018 paths: `use child::x` inside the parent
                target = self.resolve(mod, segs)
                if target is None or target == mod:
                    continue
                is_child = target[:len(mod)] == mod
                if presenting and is_child:
                    continue
                self.edges.append((mod, target, path, line, lines[line - 1].strip()))

    def cycles(self):
        found = []
        parents = {m[:-1] for m in self.files if m}
        for level in sorted(parents):
            def node(m):
                if m[:len(level)] != level:
                    return None
                return m[len(level)] if len(m) > len(level) else "self"
            graph, why = {}, {}
            for a, b, path, line, text in self.edges:
                na, nb = node(a), node(b)
                if na is None or nb is None or na == nb:
                    continue
                graph.setdefault(na, set()).add(nb)
                why.setdefault((na, nb), (path, line, text))
            for comp in sccs(graph):
                if len(comp) > 1:
                    found.append((level, comp, graph, why))
        return found


def expand(tree):
    """`a::{b, c::{d, e}}` -> [[a,b],[a,c,d],[a,c,e]]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    def parse(s):
        items, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        out = []
        for it in items:
            it = it.strip()
            if not it:
                continue
            if "{" in it:
                head = it[:it.index("{")].rstrip(":").strip()
                inner = it[it.index("{") + 1:it.rindex("}")]
                for sub in parse(inner):
                    out.append((head.split("::") if head else []) + sub)
            else:
                out.append([p.strip() for p in it.split(" as ")[0].split("::")])
        return out
    return [[s for s in segs if s] for segs in parse(tree)]


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    dirs = argv or sorted(os.path.join(ROOT, "crates", d) for d in os.listdir(os.path.join(ROOT, "crates"))
                          if os.path.isdir(os.path.join(ROOT, "crates", d, "src")))
    bad, modules = 0, 0
    for d in dirs:
        crate = Crate(os.path.join(d, "src"))
        crate.build()
        modules += len(crate.files)
        name = os.path.basename(os.path.normpath(d))
        for level, comp, graph, why in crate.cycles():
            bad += 1
            where = "::".join((name,) + level)
            print(f"cycle in {where}: {' <-> '.join(comp)}")
            for a in comp:
                for b in sorted(graph.get(a, ())):
                    if b in comp:
                        path, line, text = why[(a, b)]
                        print(f"    {a} -> {b}: {os.path.relpath(path, ROOT)}:{line}: {text}")
    if bad:
        print(f"{bad} module cycle(s); see the docstring of .ci/modgraph.py for what counts")
        return 1
    print(f"no module cycles in {len(dirs)} crates ({modules} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
