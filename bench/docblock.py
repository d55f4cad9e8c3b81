"""Blocks one bench script writes into a document another one generates (docs/benchmarks.md).

    docblock.py put DOC NAME FROM   # DOC's block NAME becomes FROM's text, headings one level down
    docblock.py keep DOC            # prints every block of DOC, for its generator to append again

A block runs from "<!-- block NAME -->" to "<!-- end NAME -->"; put appends it when DOC has none.
"""
import re
import sys


def put(doc, name, src):
    body = re.sub(r"^(#+) ", r"#\1 ", open(src).read(), flags=re.M)
    block = "<!-- block %s -->\n%s<!-- end %s -->\n" % (name, body if body.endswith("\n") else body + "\n", name)
    try:
        text = open(doc).read()
    except FileNotFoundError:
        text = ""
    pattern = re.compile(r"<!-- block %s -->\n.*?<!-- end %s -->\n" % (re.escape(name), re.escape(name)), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text += ("\n" if text and not text.endswith("\n\n") else "") + block
    open(doc, "w").write(text)


def keep(doc):
    try:
        text = open(doc).read()
    except FileNotFoundError:
        return
    for m in re.finditer(r"<!-- block (\S+) -->\n.*?<!-- end \1 -->\n", text, re.S):
        sys.stdout.write("\n" + m.group(0))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "put":
        put(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "keep":
        keep(sys.argv[2])
    else:
        sys.exit(__doc__)
