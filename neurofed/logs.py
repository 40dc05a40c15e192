"""Logging, set up once: every neurofed module logs to ``logging.getLogger(__name__)``.

- the console (stderr) shows WARNING and above as ``neurofed: <message>``; INFO too with
  ``--verbose`` (:func:`configure`). A record logged with ``extra={"console": True}`` is
  shown at INFO as well: the few lines a run always prints (the device it trains on).
- a run directory gets ``run.log``: every INFO record of that run with a timestamp
  (:func:`open_run_log`; appended to on ``--resume``): the data decode into its cache,
  DVS event binning, algorithm notes, the post-training steps.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = "neurofed"
RUN_LOG = "run.log"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Console(logging.StreamHandler):
    """stderr as it is when a record is written (pytest and tqdm replace it)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class _ConsoleFilter(logging.Filter):
    def __init__(self, handler: logging.Handler):
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.handler.threshold or getattr(record, "console", False)


def _console() -> _Console | None:
    return next((h for h in logging.getLogger(ROOT).handlers if isinstance(h, _Console)), None)


def configure(verbose: bool = False) -> None:
    """Console handler for the ``neurofed`` loggers (idempotent; ``verbose``: INFO too)."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(logging.INFO)  # run.log takes INFO; the console handler filters
    logger.propagate = False  # one line per record, whatever the root logger has
    handler = _console()
    if handler is None:
        handler = _Console()
        handler.setFormatter(logging.Formatter("neurofed: %(message)s"))
        handler.addFilter(_ConsoleFilter(handler))
        logger.addHandler(handler)
    handler.threshold = logging.INFO if verbose else logging.WARNING


def open_run_log(run_dir: Path) -> Path:
    """Send INFO and above to ``run_dir/run.log`` (appending) until :func:`close_run_log`;
    a run log still open from an earlier run in this process is closed first."""
    if _console() is None:
        configure()
    close_run_log()
    path = Path(run_dir) / RUN_LOG
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    handler.neurofed_run_log = True
    logging.getLogger(ROOT).addHandler(handler)
    return path


def close_run_log() -> None:
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if getattr(h, "neurofed_run_log", False)]:
        logger.removeHandler(h)
        h.close()
