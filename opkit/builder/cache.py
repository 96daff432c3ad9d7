"""The content-addressed build cache: location, keys, locks, atomic publication, loading.

An entry is a folder `<op>-<key16>` holding the generated source, the compiled module, the build
log and `meta.json`. It is assembled in a private temporary folder and renamed into place in one
`os.replace`, so a reader sees a complete entry or none; a file lock makes a second process
wait for the first instead of compiling the same thing twice.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterator, Optional

_LOADED: Dict[str, object] = {}


def cache_root() -> Path:
    """OPKIT_CACHE_DIR, else $XDG_CACHE_HOME/opkit, else ~/.cache/opkit."""
    env = os.environ.get("OPKIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opkit"


def cache_key(material: dict) -> str:
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def entry_dir(name: str, key: str) -> Path:
    return cache_root() / f"{name}-{key[:16]}"


def read_meta(entry: Path) -> Optional[dict]:
    try:
        return json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = 1800.0) -> Iterator[None]:
    """An exclusive lock held while the block runs; released if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process lock, the atomic rename still holds
            yield
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def new_workdir(name: str, key: str) -> Path:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".tmp-{name}-{key[:16]}-{os.getpid()}-{time.monotonic_ns()}"
    work.mkdir()
    return work


def publish(work: Path, entry: Path) -> None:
    """Move a finished work folder into place atomically (replacing an older entry if any)."""
    if entry.exists():
        trash = entry.with_name(f".trash-{entry.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(entry, trash)
        os.replace(work, entry)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(work, entry)


def load_module(so_path: Path, module_name: str):
    """Import a compiled kernel module once per process."""
    key = str(so_path)
    if key not in _LOADED:
        spec = importlib.util.spec_from_file_location(module_name, so_path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load kernel module {so_path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[key] = module
    return _LOADED[key]


_ENTRY = re.compile(r"[a-z][a-z0-9_]*-[0-9a-f]{16}\Z")
_LEFTOVER = re.compile(r"(\.tmp-|\.trash-|failed-)[a-z][a-z0-9_]*-[0-9a-f]{16}.*\Z")
_LOCK = re.compile(r"\.[a-z][a-z0-9_]*-[0-9a-f]{16}\.lock\Z")


def clean(stale_only: bool = False) -> int:
    """Remove cache entries (or only leftovers of interrupted builds); returns how many.

    Only names opkit itself creates are touched, whatever folder OPKIT_CACHE_DIR points at."""
    root = cache_root()
    if not root.is_dir():
        return 0
    removed = 0
    for p in root.iterdir():
        leftover = bool(_LEFTOVER.match(p.name))
        ours = leftover or bool(_ENTRY.match(p.name)) or bool(_LOCK.match(p.name))
        if not ours or (stale_only and not leftover):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed += 1
    return removed
