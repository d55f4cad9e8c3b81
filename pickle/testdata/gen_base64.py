#!/usr/bin/env python3
"""Writes base64_cases.json: what base64.b64decode(s) (validate=False, the call torch's
C10dRendezvousBackend makes) returns for tricky inputs, or that it raises. Run from anywhere:

    python3 testdata/gen_base64.py
"""
import base64
import binascii
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [
    b"", b"=", b"==", b"===", b"====", b"A", b"AA", b"AAA", b"AAAA", b"AA=", b"AA==", b"AAA=",
    b"AAA==", b"AA===", b"A===", b"A=AA", b"AA=A", b"AA=AA", b"AA==AA==", b"aGk=aGk=", b"AAA=A",
    b"aGVsbG8=", b"aGVsbG8", b"aGVsbA==", b"aGVsbA=", b"aGVsbA", b"aGVs bG8=", b"aGVs\nbG8=\n",
    b"aGVs\r\nbG8=", b"\taGVsbG8=\t", b"!aGVsbG8=!", b"aGVsbG8=garbage", b"aGVsbG8==", b"aGVsbG8===",
    b"aG=Vs", b"a=G=V=s", b"=aGVs", b"==aGVs", b"aGV=s", b"aGVz=Cg==", b"-_-_", b"aGk-", b"aGk_",
    b"+/+/", b"////", b"\x80\xff\x00aGk=", "aGk=\u00e9".encode(), b"aGk=\x00", b"\x00\x00\x00\x00",
    b"aGVsbG8gd29ybGQ=", b"aGVsbG8gd29ybGQ", b"aGVsbG8gd29ybGQ==", b"a", b"ab", b"abc", b"abcd",
    b"abcde", b"abcdef", b"abcdefg", b"abcdefgh", b"ab=cd", b"ab==cd", b"abc=d", b"ab\n==",
    b"ab=\n=", b"ab=x=", b"ab=!=", b"YWJj" * 300, b"YWJj" * 300 + b"Y", b"YWJj" * 300 + b"YQ",
]


def main():
    rng = random.Random(7)
    cases = list(CASES)
    alphabet = b"AQgw/+=!-_\n \x00\xff"
    for n in range(1, 9):
        for _ in range(150):
            cases.append(bytes(rng.choice(alphabet) for _ in range(n)))
    for _ in range(300):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        s = bytearray(base64.b64encode(data))
        for _ in range(rng.randrange(3)):
            s.insert(rng.randrange(len(s) + 1), rng.choice(alphabet))
        cases.append(bytes(s))
    out = []
    seen = set()
    for c in cases:
        if c in seen:
            continue
        seen.add(c)
        try:
            d = base64.b64decode(c)
            out.append({"in": c.hex(), "ok": True, "out": d.hex()})
        except binascii.Error:
            out.append({"in": c.hex(), "ok": False})
    with open(os.path.join(HERE, "base64_cases.json"), "w") as f:
        json.dump({"python": sys.version.split()[0], "cases": out}, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
