#!/usr/bin/env python3
"""The source trees the transfer benches send, made once under a directory and then reused.

    python3 bench/trees.py DIR TREE…

TREE is one of:
  small  5000 files of 4–5 KiB (random sizes, seeded: the same sizes on every machine)
         in 50 directories, DIR/small/dNN/fNNN;
  one    one file of 1 GiB, DIR/one/big;
  big    1 GiB in 8 files of 128 MiB, DIR/big/bN.
A tree whose directory exists is left as it is. Contents are random bytes (os.urandom).
"""
import os
import random
import sys


def small(b):
    for d in range(50):
        os.makedirs(f"{b}/small/d{d:02}")
        for f in range(100):
            with open(f"{b}/small/d{d:02}/f{f:03}", "wb") as fh:
                fh.write(os.urandom(random.randint(4096, 5120)))


def one(b):
    os.makedirs(f"{b}/one")
    with open(f"{b}/one/big", "wb") as fh:
        for _ in range(1024):
            fh.write(os.urandom(1 << 20))


def big(b):
    os.makedirs(f"{b}/big")
    for i in range(8):
        with open(f"{b}/big/b{i}", "wb") as fh:
            for _ in range(128):
                fh.write(os.urandom(1 << 20))


MAKERS = {"small": small, "one": one, "big": big}

if __name__ == "__main__":
    if len(sys.argv) < 3 or any(t not in MAKERS for t in sys.argv[2:]):
        sys.exit(__doc__)
    b = sys.argv[1]
    random.seed(16)
    for tree in sys.argv[2:]:
        if not os.path.isdir(f"{b}/{tree}"):
            MAKERS[tree](b)
