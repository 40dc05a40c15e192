"""The in-memory dataset every experiment works on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class DataFileError(ValueError):
    """A data set file is missing, malformed or not what its layout promises (one line)."""


@dataclass
class Dataset:
    """Train and test split of one dataset, ready for partitioning and encoding.

    ``kind`` says what the samples are:
    - ``"image"``: ``x_*`` arrays (N, C, H, W), either uint8 pixels 0-255 (the file
      data sets: memory maps of the cache, shared by every client) or float32 in
      [0, 1] (``digits``); the encoder (rate or direct) scales and turns each batch
      into (N, C, H, W, T) inputs.
    - ``"events"``: ``x_*`` arrays (N, C, H, W, T) of binned event counts (C = 2
      polarities; uint8 frames from the cache) that already are spike tensors; no
      encoder is applied.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    kind: str = "image"
    info: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample, without the time axis."""
        return tuple(self.x_train.shape[1:4])

    def __post_init__(self):
        self.y_train = np.asarray(self.y_train, dtype=np.int64)
        self.y_test = np.asarray(self.y_test, dtype=np.int64)
        if self.kind not in ("image", "events"):
            raise ValueError(f"Dataset.kind: got {self.kind!r}; allowed: image, events")
