"""``full_page`` mode of the web backends: a linked page's text instead of the API's snippet.

The page's visible text (scripts, styles, navigation dropped) is cut to ``passage_words`` words
starting where the snippet's first words occur, so the passage is the part of the page the search
engine matched; a page that cannot be fetched, is not HTML or lacks the snippet keeps the snippet.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

MAX_PAGE_BYTES = 2 << 20
SNIPPET_PROBE_WORDS = 6


class _TextExtractor(HTMLParser):
    SKIP = {"script", "style", "noscript", "head", "nav", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML document, whitespace collapsed."""
    parser = _TextExtractor()
    parser.feed(html)
    return re.sub(r"\s+", " ", " ".join(parser.parts)).strip()


def passage_around(text: str, snippet: str, num_words: int) -> str | None:
    """``num_words`` words of ``text`` starting where the snippet's first words occur, else None."""
    words = text.split()
    probe = re.sub(r"\.\.\.|…", " ", snippet).split()[:SNIPPET_PROBE_WORDS]
    if not probe or not words:
        return None
    for start in range(len(words) - len(probe) + 1):
        if words[start:start + len(probe)] == probe:
            return " ".join(words[start:start + num_words])
    return None
