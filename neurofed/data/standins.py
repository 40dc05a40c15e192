"""Learnable STAND-INS of the papers' image data sets, built from the embedded digits.

A paper preset names MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 or SVHN, whose files
are not on every machine (and are never downloaded). To show that a preset's network
*learns* — same model, T, encoding, neuron, optimizer and algorithm — it needs data
of the same shape that carries a learnable signal. These data sets are made from
scikit-learn's 8x8 handwritten digits (the embedded default) and are registered as
``standin_<name>``:

============================  ==========  =======  ==========================================
``data.name``                 shape       classes  made of
============================  ==========  =======  ==========================================
``standin_mnist``             1x28x28     10       a digit upscaled to 20x20 (bilinear), placed
                                                   with a random shift of up to 3 px, grey
``standin_fashion_mnist``     1x28x28     10       the same with other shifts and the strokes
                                                   thickened (filled shapes, not thin strokes)
``standin_cifar10``           3x32x32     10       a digit at 24x24 at a random place, random
                                                   foreground and background colours (contrast
                                                   >= 0.3), pixel noise: colour says nothing
``standin_svhn``              3x32x32     10       a digit at 24x24 in the centre, its
                                                   neighbours cut at both edges (SVHN's crops),
                                                   random colours and noise
``standin_cifar100``          3x32x32     100      two digits side by side at 16x16 each,
                                                   class = 10 x left + right, random colours
============================  ==========  =======  ==========================================

Train images come from the digits' training split and test images from its test split
(the split of :mod:`neurofed.data.digits`), so no test digit is ever trained on. Every
image is drawn from one fixed seed (not the run's), so every run sees the same stand-in.
Pixels are uint8 (N, C, H, W) like the file data sets', so the encoders, ``data.mean``
/ ``data.std`` and subsets treat them alike. A stand-in is never a paper's data: its
accuracies say that a preset learns, not what the paper's table would show.
"""

from __future__ import annotations

import numpy as np

from neurofed.data import register_dataset
from neurofed.data.base import Dataset

STANDIN_SEED = 20_241_126  # fixed: every run sees the same stand-in images
CIFAR100_PAIRS = (50, 10)  # pairs per class drawn for train / test (5,000 / 1,000 images)

#: stand-in name -> (paper data set it stands for, input shape, classes)
STANDINS = {
    "standin_mnist": ("mnist", (1, 28, 28), 10),
    "standin_fashion_mnist": ("fashion_mnist", (1, 28, 28), 10),
    "standin_cifar10": ("cifar10", (3, 32, 32), 10),
    "standin_svhn": ("svhn", (3, 32, 32), 10),
    "standin_cifar100": ("cifar100", (3, 32, 32), 100),
}


def standin_name(dataset: str) -> str | None:
    """The stand-in registered for a paper data set (``mnist`` -> ``standin_mnist``)."""
    name = f"standin_{dataset}"
    return name if name in STANDINS else None


def _digit_split(data_cfg: dict) -> tuple:
    from neurofed.data.digits import load_digits

    ds = load_digits({"test_fraction": data_cfg.get("test_fraction", 0.25)})
    return ds.x_train[:, 0], ds.y_train, ds.x_test[:, 0], ds.y_test  # (N, 8, 8) in [0, 1]


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    """(N, 8, 8) -> (N, size, size), bilinear (torch's, align_corners=False)."""
    import torch
    import torch.nn.functional as F

    t = torch.as_tensor(images, dtype=torch.float32)[:, None]
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)[:, 0].clamp(0, 1).numpy()


def _thicken(images: np.ndarray) -> np.ndarray:
    """A 3x3 grey dilation: strokes become filled shapes."""
    from scipy.ndimage import grey_dilation

    return np.stack([grey_dilation(im, size=(3, 3)) for im in images])


def _place(glyphs: np.ndarray, canvas: int, rng: np.random.Generator, jitter: int | None) -> np.ndarray:
    """Glyphs (N, g, g) on (N, canvas, canvas): centred, shifted by up to ``jitter`` px
    (None: anywhere the glyph fits)."""
    n, g = len(glyphs), glyphs.shape[-1]
    out = np.zeros((n, canvas, canvas), np.float32)
    centre = (canvas - g) // 2
    for i in range(n):
        if jitter is None:
            r, c = rng.integers(0, canvas - g + 1, size=2)
        else:
            r, c = np.clip(centre + rng.integers(-jitter, jitter + 1, size=2), 0, canvas - g)
        out[i, r:r + g, c:c + g] = glyphs[i]
    return out


def _colour(masks: np.ndarray, rng: np.random.Generator, noise: float = 0.08) -> np.ndarray:
    """Grey masks (N, H, W) in [0, 1] -> RGB (N, 3, H, W) uint8: a random foreground and
    background colour per image, the foreground the brighter by at least 0.3 (mean over
    channels, so the shape shows in every encoding's intensity), plus pixel noise."""
    n = len(masks)
    fg, bg = rng.random((n, 3)), rng.random((n, 3))
    dim = fg.mean(1) < bg.mean(1) + 0.3
    while dim.any():
        k = int(dim.sum())
        fg[dim], bg[dim] = rng.random((k, 3)), rng.random((k, 3))
        dim = fg.mean(1) < bg.mean(1) + 0.3
    m = masks[:, None]
    img = bg[:, :, None, None] * (1 - m) + fg[:, :, None, None] * m
    img = img + rng.normal(0, noise, img.shape)
    return np.round(np.clip(img, 0, 1) * 255).astype(np.uint8)


def _grey(masks: np.ndarray) -> np.ndarray:
    return np.round(np.clip(masks, 0, 1) * 255).astype(np.uint8)[:, None]


def _svhn_like(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A 24x24 digit in the centre of 32x32, with random other digits of the same split
    cut by the left and right edges (SVHN's crops of house numbers)."""
    big = _resize(x, 24)
    n = len(x)
    canvas = np.zeros((n, 32, 32), np.float32)
    canvas[:, 4:28, 4:28] = big
    left, right = rng.integers(0, n, size=n), rng.integers(0, n, size=n)
    canvas[:, 4:28, 0:6] = np.maximum(canvas[:, 4:28, 0:6], big[left][:, :, 18:24])  # right part of one
    canvas[:, 4:28, 26:32] = np.maximum(canvas[:, 4:28, 26:32], big[right][:, :, 0:6])  # left part of one
    return canvas


def _pairs(x: np.ndarray, y: np.ndarray, per_class: int, rng: np.random.Generator) -> tuple:
    """``per_class`` images of each class 10a+b: digit a (left) beside digit b (right)."""
    by_label = [np.flatnonzero(y == d) for d in range(10)]
    small = _resize(x, 16)
    images, labels = [], []
    for cls in range(100):
        a, b = divmod(cls, 10)
        ia, ib = rng.choice(by_label[a], per_class), rng.choice(by_label[b], per_class)
        canvas = np.zeros((per_class, 32, 32), np.float32)
        canvas[:, 8:24, 0:16] = small[ia]
        canvas[:, 8:24, 16:32] = small[ib]
        images.append(canvas)
        labels.append(np.full(per_class, cls))
    return np.concatenate(images), np.concatenate(labels)


def _build(name: str, x: np.ndarray, y: np.ndarray, split: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([STANDIN_SEED, sorted(STANDINS).index(name), split == "test"])
    if name == "standin_mnist":
        return _grey(_place(_resize(x, 20), 28, rng, jitter=3)), y
    if name == "standin_fashion_mnist":
        return _grey(_place(_thicken(_resize(x, 20)), 28, rng, jitter=3)), y
    if name == "standin_cifar10":
        return _colour(_place(_resize(x, 24), 32, rng, jitter=None), rng), y
    if name == "standin_svhn":
        return _colour(_svhn_like(x, y, rng), rng), y
    if name == "standin_cifar100":
        masks, labels = _pairs(x, y, CIFAR100_PAIRS[split == "test"], rng)
        return _colour(masks, rng), labels
    raise KeyError(name)


def load_standin(name: str, data_cfg: dict) -> Dataset:
    for_name, shape, classes = STANDINS[name]
    x_tr, y_tr, x_te, y_te = _digit_split(data_cfg)
    xa, ya = _build(name, x_tr, y_tr, "train")
    xb, yb = _build(name, x_te, y_te, "test")
    assert xa.shape[1:] == shape, (name, xa.shape)
    return Dataset(name, xa, ya, xb, yb, num_classes=classes, kind="image",
                   info={"standin_for": for_name,
                         "note": f"STAND-IN for {for_name} made from scikit-learn's digits (not {for_name})"})


def describe(name: str, digits_train: int, digits_test: int) -> dict:
    """The ``neurofed datasets`` row of a stand-in, given the digits' split sizes."""
    for_name, shape, classes = STANDINS[name]
    train, test = digits_train, digits_test
    if classes == 100:
        train, test = 100 * CIFAR100_PAIRS[0], 100 * CIFAR100_PAIRS[1]
    return {"name": name, "found": True, "where": f"embedded STAND-IN for {for_name} (made of the digits)",
            "shape": "x".join(map(str, shape)), "classes": classes, "train": train, "test": test,
            "sizes_from": "embedded"}


def _register(name: str) -> None:
    register_dataset(name)(lambda data_cfg, seed=0: load_standin(name, data_cfg))


for _name in STANDINS:
    _register(_name)
