"""Draws the P V regions of a SASS listing (nvrtc_check.py --sass-out) as one letter an
instruction: M MUFU.EX2, P F2FP, A WARPGROUP.ARRIVE, W WARPGROUP.DEPBAR, H 64x256 HGMMA with
register A, G other HGMMA, B BAR, S STS, X FENCE/MEMBAR, j BRA, f FMUL (F: a run of 8 or
more), . anything else. A region: from the barrier before a run of four register-A HGMMAs
to three letters past the fourth.  Usage: python3 sass_shape.py LISTING"""
import re
import sys

ops = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Za-z0-9_.]+)(.*)", line)
    if not m:
        continue
    op, rest = m.group(3), m.group(4)
    if op.startswith("MUFU.EX2"):
        c = "M"
    elif op.startswith("F2FP"):
        c = "P"
    elif op == "WARPGROUP.ARRIVE":
        c = "A"
    elif op.startswith("WARPGROUP.DEPBAR"):
        c = "W"
    elif op.startswith("HGMMA") and "64x256" in op and re.match(r"\s*R\d+, R\d+, gdesc", rest):
        c = "H"
    elif op.startswith("HGMMA"):
        c = "G"
    elif op.startswith("BAR"):
        c = "B"
    elif op.startswith("STS"):
        c = "S"
    elif op.startswith("FENCE") or op.startswith("MEMBAR"):
        c = "X"
    elif op == "BRA":
        c = "j"
    elif op == "FMUL":
        c = "f"
    else:
        c = "."
    ops.append(c)
s = re.sub(r"f{8,}", "F", "".join(ops))
for m in re.finditer(r"H(?:[^G]{0,80}?H){3}", s):
    print(s[s.rfind("B", 0, m.start()) : m.end() + 3])
