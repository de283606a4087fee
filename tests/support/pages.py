"""report.html read as its reader reads it: the visible text of the page or of one section, and the
cells of its tables (scripts and styles left out), parsed with the standard library's HTML parser."""

from __future__ import annotations

import re
from html.parser import HTMLParser

#: Elements without an end tag.
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
#: Elements whose text a reader does not see.
HIDDEN = {"script", "style", "noscript", "head", "title"}


class Node:
    def __init__(self, tag: str, attrs: dict, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        """The visible text under this node, whitespace collapsed; ``<br>`` and table cells apart."""
        parts = []
        for c in self.children:
            if isinstance(c, str):
                parts.append(c)
            elif c.tag == "br":
                parts.append("\n")
            elif c.tag not in HIDDEN:
                parts.append(c.text() + (" " if c.tag in ("td", "th", "li", "p", "div", "tr", "dd", "dt") else ""))
        return re.sub(r"[ \t\r\f\v]+", " ", re.sub(r"\s*\n\s*", "\n", "".join(parts))).strip()

    def find_all(self, tag: str | None = None, **attrs):
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and all(_has(c, k, v) for k, v in attrs.items()):
                    yield c
                yield from c.find_all(tag, **attrs)

    def find(self, tag: str | None = None, **attrs):
        return next(self.find_all(tag, **attrs), None)


def _has(node: Node, key: str, value: str) -> bool:
    key = key.rstrip("_")
    if key == "class":
        return value in (node.attrs.get("class") or "").split()
    return node.attrs.get(key) == value


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.at = Node("#root", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.at)
        self.at.children.append(node)
        if tag not in VOID:
            self.at = node

    def handle_startendtag(self, tag, attrs):
        self.at.children.append(Node(tag, dict(attrs), self.at))

    def handle_endtag(self, tag):
        node = self.at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.children.append(data)


def parse(html: str) -> Node:
    b = _Builder()
    b.feed(html)
    return b.root


def visible_text(html: str, section: str | None = None) -> str:
    """The page's visible text, or that of the element with id ``section``."""
    root = parse(html)
    node = root.find(id=section) if section else root
    assert node is not None, f"no element with id {section!r}"
    return node.text()


def tables(html: str, section: str | None = None) -> list[list[list[str]]]:
    """Every table (in the element with id ``section``) as rows of cell texts."""
    root = parse(html)
    node = root.find(id=section) if section else root
    assert node is not None, f"no element with id {section!r}"
    return [[[cell.text() for cell in tr.children if isinstance(cell, Node) and cell.tag in ("td", "th")]
             for tr in table.find_all("tr")] for table in node.find_all("table")]


def footer_text(html: str) -> str:
    node = parse(html).find("footer")
    return node.text() if node is not None else ""


# -- in a browser (tests/report/test_browser.py evaluates these in Chromium) --------------------------

#: Every table's box against the box that clips it (its nearest ancestor that scrolls), and the page.
TABLES_JS = """(() => { const vw = document.documentElement.clientWidth; const out = [];
  document.querySelectorAll("table").forEach(t => {
    let p = t.parentElement;
    while (p && getComputedStyle(p).overflowX === "visible") p = p.parentElement;
    const r = t.getBoundingClientRect(), c = p ? p.getBoundingClientRect() : {left: 0, right: vw};
    out.push({stats: t.classList.contains("stats"), right: r.right, clipRight: c.right, clipLeft: c.left,
              scrolls: p ? p.scrollWidth > p.clientWidth + 1 : false, card: (t.closest("section") || {}).id});
  });
  return {vw: vw, page: document.documentElement.scrollWidth, tables: out}; })()"""

#: Per chart: the boxes of its text marks (line labels) and of its bars (rect marks), from the Vega
#: scenegraph as drawn (group offsets added), and the labels whose box overlaps a bar's.
LABELS_JS = """(() => Array.from(document.querySelectorAll(".chart .plot")).map(box => {
  const texts = [], rects = [];
  (function walk(mark, ox, oy) {
    (mark.items || []).forEach(item => {
      if (mark.marktype === "group") {
        (item.items || []).forEach(child => walk(child, ox + (item.x || 0), oy + (item.y || 0)));
      } else if (mark.role === "mark" && item.bounds && !item.bounds.empty()) {
        const b = {x1: ox + item.bounds.x1, x2: ox + item.bounds.x2, y1: oy + item.bounds.y1, y2: oy + item.bounds.y2};
        if (mark.marktype === "text") { b.text = String(item.text); texts.push(b); }
        if (mark.marktype === "rect" && b.y2 - b.y1 > 0.5 && b.x2 - b.x1 > 0.5) rects.push(b);
      }
    });
  })(box._view.scenegraph().root, 0, 0);
  const over = texts.filter(t => rects.some(r => t.x1 < r.x2 - 0.5 && r.x1 < t.x2 - 0.5 && t.y1 < r.y2 - 0.5
                                                  && r.y1 < t.y2 - 0.5)).map(t => t.text);
  return {name: box.parentElement.dataset.name || box.parentElement.id, texts: texts.length, rects: rects.length,
          over: over};
}))()"""
