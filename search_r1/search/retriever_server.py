"""``retriever_server.py``: Search-R1's README names the server this way; it is the same entry as
``retrieval_server.py`` (same flags), runnable as a script or with ``python -m``."""

if __package__ in (None, ""):
    # Started as a script: the repository root, not this folder, goes first on the path.
    import sys
    from pathlib import Path

    sys.path[0] = str(Path(__file__).resolve().parents[2])

from search_r1.search.retrieval_server import main

if __name__ == "__main__":
    main()
