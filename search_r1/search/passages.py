"""The text of retrieved passages: wiki-18 ``contents`` split into title and text, rendered as
Search-R1 renders them (``Doc {i}(Title: {title}) {text}``), and read back from a rendered block.
Owned by the search side: every environment that shows passages and the reranker read them so."""

from __future__ import annotations

from typing import Iterable, Mapping


def split_contents(contents: str) -> tuple[str, str]:
    """Split wiki-18 ``contents`` (``'"Title"\\ntext'``) into (title, text); quotes are kept."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(docs: Iterable[Mapping]) -> str:
    """Render retrieved documents as Search-R1 does: ``Doc {i}(Title: {title}) {text}\\n`` each.

    Args:
        docs: items of a ``/retrieve`` result, each ``{"document": {"contents": ...}, ...}`` or a
            bare ``{"contents": ...}`` document.
    """
    lines = []
    for i, item in enumerate(docs, start=1):
        document = item.get("document", item)
        title, text = split_contents(document["contents"])
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


def parse_passages(block: str) -> list[tuple[int, str, str]]:
    """The documents of a rendered block: the inverse of :func:`format_passages` (for reading trajectories).

    A document starts where ``Doc {i}(Title: `` of the next rank starts a line, so a passage text
    that mentions another rank does not split it. A quoted title (wiki-18's are: ``"Paris (band)"``)
    ends at its first ``") ``, another at its first ``) ``. A block cut inside a document's head (an
    observation truncated at ``max_obs_length``) keeps what it holds as the title, with no text.

    Args:
        block: the text inside ``<information>...</information>``.
    Returns:
        ``(rank, title, text)`` per document, ranks from 1; ``[]`` when the block does not start
        with ``Doc 1(Title: `` (an empty block, ``do_search=False``).
    """
    block = block.strip()
    starts: list[int] = []
    while True:
        head = f"Doc {len(starts) + 1}(Title: "
        if not starts:
            start = 0 if block.startswith(head) else -1
        else:
            start = block.find("\n" + head, starts[-1])
            start = start + 1 if start >= 0 else -1
        if start < 0:
            break
        starts.append(start)
    documents = []
    for rank, start in enumerate(starts, start=1):
        end = starts[rank] - 1 if rank < len(starts) else len(block)  # the newline before the next head
        doc = block[start + len(f"Doc {rank}(Title: "):end]
        title_end = doc.find('") ') + 1 if doc.startswith('"') else 0
        title_end = title_end if title_end > 0 else doc.find(") ")
        if title_end < 0:  # no text (empty, or the block was cut inside the head)
            documents.append((rank, doc.removesuffix(")"), ""))
        else:
            documents.append((rank, doc[:title_end], doc[title_end + 2:]))
    return documents
