"""The data and the quality score of the GAN example.

Data: scikit-learn's bundled handwritten digits (1797 images of 8x8 pixels, 0..16), upsampled
bilinearly to 32x32 and scaled to [-1, 1].

Score: the Fréchet distance between the real digits and generated ones in the feature space of
a small convolutional classifier trained on the digits (its 64 penultimate activations):

    FD = |mu_r - mu_g|^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2))

This is the formula of the Fréchet Inception Distance, but in the features of this digits
classifier, not of Inception-v3 on ImageNet: a digits-specific FID, comparable only with other
numbers from this file at the same sample size.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

FEATURES = 64
CLASSIFIER_SEED = 0
CLASSIFIER_EPOCHS = 12


def load_digits_sklearn():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the GAN example trains on scikit-learn's bundled digits: "
                          "pip install scikit-learn (or pip install 'opkit[gan]')") from None
    return load_digits()


def images(size: int = 32) -> Tuple[torch.Tensor, torch.Tensor]:
    """(images [1797, 1, size, size] float32 in [-1, 1], labels [1797] int64)."""
    d = load_digits_sklearn()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (x * 2 - 1).clamp_(-1, 1).contiguous(), torch.from_numpy(d.target.astype(np.int64))


class Classifier(nn.Module):
    """Three 3x3 convolutions with ReLU and 2x2 max pooling, 64 features, 10 classes."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, FEATURES), nn.ReLU())
        self.fc = nn.Linear(FEATURES, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def split(n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """A fixed 80/20 split of the digits' indices (train, held out)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(CLASSIFIER_SEED))
    cut = n * 4 // 5
    return perm[:cut], perm[cut:]


def train_classifier(log: Callable[[str], None] = print) -> Tuple[Classifier, float]:
    """Train on 80% of the digits; returns the model and its accuracy on the other 20%."""
    x, y = images()
    tr, te = split(len(x))
    gen = torch.Generator().manual_seed(CLASSIFIER_SEED)
    with torch.random.fork_rng():
        torch.manual_seed(CLASSIFIER_SEED)
        model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for epoch in range(CLASSIFIER_EPOCHS):
        model.train()
        for idx in tr[torch.randperm(len(tr), generator=gen)].split(64):
            # small random shifts, so the features see more than the exact training pixels
            xb = torch.roll(x[idx], shifts=tuple(torch.randint(-2, 3, (2,), generator=gen).tolist()),
                            dims=(2, 3))
            loss = F.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x[te]).argmax(1) == y[te]).float().mean().item()
    log(f"digits classifier: {acc:.1%} accuracy on {len(te)} held-out digits")
    return model, acc


def cache_path(cache_dir: Optional[Path] = None) -> Path:
    """Where the trained classifier is kept: keyed by this file's text and PyTorch's version,
    so a change to either trains it again. Default: the `examples` folder of opkit's cache."""
    if cache_dir is None:
        from opkit.builder.cache import cache_root
        cache_dir = cache_root() / "examples"
    key = hashlib.sha256(Path(__file__).read_bytes() + torch.__version__.encode()).hexdigest()
    return Path(cache_dir) / f"gan-digits-classifier-{key[:16]}.pt"


def classifier(cache_dir: Optional[Path] = None,
               log: Callable[[str], None] = print) -> Tuple[Classifier, float]:
    """The trained classifier (eval mode, no gradients) and its held-out accuracy: trained once,
    then loaded from the cache."""
    path = cache_path(cache_dir)
    model = Classifier()
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["state"])
        acc = float(saved["accuracy"])
    else:
        model, acc = train_classifier(log)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pt")
        os.close(fd)
        try:  # written whole, then renamed: a reader never sees half a file
            torch.save({"state": model.state_dict(), "accuracy": acc}, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    model.eval().requires_grad_(False)
    return model, acc


def feature_stats(model: Classifier, x: torch.Tensor, batch: int = 512) -> Tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (float64) of the classifier's features of images x."""
    with torch.no_grad():
        f = torch.cat([model.features(x[i:i + batch].float().contiguous())
                       for i in range(0, len(x), batch)])
    f = f.double().numpy()
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """The Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2).

    Tr((S1 S2)^(1/2)) is computed as Tr((A S2 A)^(1/2)) with A = S1^(1/2): the same eigenvalues
    (A S2 A = A (S1 S2) A^-1 when S1 is invertible, and by continuity otherwise), but the matrix
    is symmetric positive semidefinite, so `eigvalsh` gives them without the complex parts and
    failures a general matrix square root can have."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != mu1.shape * 2:
        raise ValueError(f"frechet_distance: means {mu1.shape}, {mu2.shape} and covariances "
                         f"{s1.shape}, {s2.shape} do not describe two Gaussians of one dimension")
    w, v = np.linalg.eigh((s1 + s1.T) / 2)
    a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    m = a @ ((s2 + s2.T) / 2) @ a
    tr_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt)


def nyquist_share(x: torch.Tensor) -> float:
    """The share of the images' spectral energy (each image's mean removed) on the Nyquist
    frequencies: the row and the column of the 2-D power spectrum where a pattern alternates from
    one pixel to the next (a checkerboard where they cross). x [N, 1, H, W], H and W even."""
    if x.dim() != 4 or x.shape[1] != 1 or x.shape[2] % 2 or x.shape[3] % 2:
        raise ValueError(f"nyquist_share: x must be [N, 1, H, W] with even H and W; got "
                         f"{list(x.shape)}")
    x = x.detach().double()[:, 0]
    p = torch.fft.fft2(x - x.mean(dim=(-2, -1), keepdim=True)).abs().square().mean(0)
    h, w = p.shape
    total = float(p.sum())
    on_nyquist = float(p[h // 2].sum() + p[:, w // 2].sum() - p[h // 2, w // 2])
    return on_nyquist / total if total > 0 else 0.0


class Scorer:
    """The digits FID of generated images against all real digits."""

    def __init__(self, cache_dir: Optional[Path] = None, log: Callable[[str], None] = print):
        self.model, self.accuracy = classifier(cache_dir, log)
        self.real, _ = images()
        self.mu, self.sigma = feature_stats(self.model, self.real)
        self.real_nyquist = nyquist_share(self.real)

    def __call__(self, fake: torch.Tensor) -> float:
        return frechet_distance(self.mu, self.sigma, *feature_stats(self.model, fake))

    def real_floor(self, n: int, seed: int = 0) -> float:
        """The score of `n` real digits drawn at random: what a perfect generator gets at this
        sample size (the estimate's own bias)."""
        idx = torch.randint(0, len(self.real), (n,), generator=torch.Generator().manual_seed(seed))
        return self(self.real[idx])
