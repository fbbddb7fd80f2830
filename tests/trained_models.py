"""Trained models for the tests, so that task metrics are measured on a model that has learnt
something, on real held-out data, instead of on random weights and noise.

* ``digits_cnn``: Conv-BN-ReLU blocks classifying scikit-learn's bundled 8x8 handwritten digits
  (``sklearn.datasets.load_digits``: 1797 images, 10 classes), trained on a stratified 80% split,
  accuracy measured on the other 20% (360 images).
* ``shapes_unet``: a small encoder-decoder with BatchNorm (two poolings, bilinear upsampling,
  skip connections) segmenting generated 32x32 RGB scenes into background / disk / square.
  Colours are random per shape, so the network has to learn shape, not colour.

Training is seeded and runs on one thread, so the weights are the same on every machine; each
model trains in seconds on 2 cores. ``train_*`` writes the state_dict and returns the held-out
data and the PyTorch accuracy; recipes load it through ``model.checkpoint``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional

SEED = 0
SHAPE_CLASSES = ("background", "disk", "square")


def _cbr(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


def _up(x):
    return functional.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(_cbr(1, 16), _cbr(16, 32), nn.MaxPool2d(2), _cbr(32, 32))
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class ShapesUNet(nn.Module):
    def __init__(self, classes: int = len(SHAPE_CLASSES)):
        super().__init__()
        self.enc1 = nn.Sequential(_cbr(3, 16), _cbr(16, 16))
        self.enc2 = nn.Sequential(_cbr(16, 32), _cbr(32, 32))
        self.mid = _cbr(32, 32)
        self.dec2 = _cbr(64, 32)
        self.dec1 = _cbr(48, 16)
        self.out = nn.Conv2d(16, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(functional.max_pool2d(e1, 2))
        m = self.mid(functional.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([_up(m), e2], 1))
        d1 = self.dec1(torch.cat([_up(d2), e1], 1))
        return self.out(d1)


def digits_cnn() -> nn.Module:
    return DigitsCNN()


def shapes_unet() -> nn.Module:
    return ShapesUNet()


# --- data ---------------------------------------------------------------------------------------


def digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, held-out x, held-out y); x is N x 1 x 8 x 8 float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return tuple(train_test_split(x, d.target, test_size=0.2, stratify=d.target, random_state=SEED))  # type: ignore[return-value]


def shapes_data(n: int, seed: int, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """``n`` scenes (N x 3 x size x size float32 in [0, 1]) and their class maps (N x size x size).

    Each scene: a random smooth background with noise, then 1-3 shapes (disk or axis-aligned
    square, radius 4-8 px, random colour) painted in order, later ones over earlier ones."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    images = np.empty((n, 3, size, size), np.float32)
    labels = np.zeros((n, size, size), np.int64)
    for i in range(n):
        a, b = rng.uniform(0, 1, (2, 3, 1, 1))
        ramp = (xx + yy)[None] / (2 * size)
        img = a * (1 - ramp) + b * ramp + rng.normal(0, 0.05, (3, size, size))
        for _ in range(rng.integers(1, 4)):
            cls = int(rng.integers(1, 3))
            r = rng.uniform(4, 8)
            cy, cx = rng.uniform(r, size - r, 2)
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r if cls == 1 else (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
            img[:, mask] = rng.uniform(0, 1, (3, 1)) + rng.normal(0, 0.05, (3, int(mask.sum())))
            labels[i][mask] = cls
        images[i] = np.clip(img, 0, 1)
    return images, labels


# --- training -----------------------------------------------------------------------------------


@dataclass
class Trained:
    checkpoint: Path
    heldout_x: np.ndarray
    heldout_y: np.ndarray
    train_accuracy: float
    heldout_accuracy: float  # top-1 (digits) or pixel accuracy (shapes), PyTorch, eval mode


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def predict(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Class indices (argmax over axis 1) of ``model`` in eval mode."""
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).argmax(1).numpy()


def _fit(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, batch: int, lr: float) -> None:
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * -(-len(x) // batch))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            opt.zero_grad()
            functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
            sched.step()
    model.eval()


def train_digits(path: Path) -> Trained:
    x_train, x_test, y_train, y_test = digits_data()
    with _one_thread():
        torch.manual_seed(SEED)
        model = DigitsCNN()
        _fit(model, x_train, y_train, epochs=10, batch=64, lr=1e-2)
        train_acc = float((predict(model, x_train) == y_train).mean())
        test_acc = float((predict(model, x_test) == y_test).mean())
    torch.save(model.state_dict(), path)
    return Trained(path, x_test, y_test, train_acc, test_acc)


def train_shapes(path: Path, n_train: int = 768, n_heldout: int = 32, epochs: int = 6) -> Trained:
    x_train, y_train = shapes_data(n_train, seed=SEED)
    x_test, y_test = shapes_data(n_heldout, seed=SEED + 1)
    with _one_thread():
        torch.manual_seed(SEED)
        model = ShapesUNet()
        _fit(model, x_train, y_train, epochs=epochs, batch=16, lr=1e-2)
        train_acc = float((predict(model, x_train) == y_train).mean())
        test_acc = float((predict(model, x_test) == y_test).mean())
    torch.save(model.state_dict(), path)
    return Trained(path, x_test, y_test, train_acc, test_acc)
