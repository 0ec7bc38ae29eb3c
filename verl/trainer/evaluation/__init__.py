"""Evaluation as Search-R1 reports it: per-source EM tables with bootstrap intervals.

``stats``: the bootstrap intervals (pure functions); ``report``: tables, Markdown and comparisons
from validation's per-question records; ``inputs``: start-up checks of the model, data and
retriever; ``compare``: ``python -m verl.trainer.evaluation.compare A.json B.json``. The entry
point is ``verl.trainer.main_eval`` (``bash evaluate.sh``).
"""
