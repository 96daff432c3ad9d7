"""The content-addressed build cache: location, keys, locks, atomic publication, verification,
loading.

An entry is a folder `<op>-<key16>` holding the generated source, the compiled module, the build
log and `meta.json`. It is assembled in a private temporary folder and renamed into place in one
`os.replace`, so a reader sees a complete entry or none; a file lock makes a second process
wait for the first instead of compiling the same thing twice. `meta.json` records the size and
sha256 of the module and its source; a module is loaded only when it matches them.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, overload

from ..errors import BuildError

_LOADED: Dict[str, object] = {}
_VERIFIED: Dict[tuple, str] = {}  # (device, inode, size, mtime) -> sha256 checked in this process


def cache_root() -> Path:
    """OPKIT_CACHE_DIR, else $XDG_CACHE_HOME/opkit, else ~/.cache/opkit."""
    env = os.environ.get("OPKIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opkit"


# Read-only folders of modules built ahead of time, searched after the user's cache: the one an
# installed opkit carries (opkit/prebuilt) and those of installed operator packages.
_SHIPPED: List[Path] = []


def add_shipped(folder: Path) -> None:
    """Search `folder` (an operator package's prebuilt modules) for cache entries too."""
    folder = Path(folder)
    if folder not in _SHIPPED:
        _SHIPPED.append(folder)
        _recorded_width.cache_clear()


# What a shipped module may differ in from this process's toolchain: Cython's version (it wrote
# the C, nothing runs it later), NumPy's (checked by `numpy_compatible`), Python's micro version
# (the ABI is ext_suffix's)
LOOSE = ("cython", "numpy", "python")


@overload
def loose(material: Dict[str, object]) -> Dict[str, object]: ...
@overload
def loose(material: object) -> Optional[Dict[str, object]]: ...


def loose(material: object) -> Optional[Dict[str, object]]:
    """The material less its LOOSE keys; None for anything but a mapping (a damaged record)."""
    return {k: v for k, v in material.items() if k not in LOOSE} if isinstance(material, dict) else None


def numpy_compatible(built: str, running: str) -> bool:
    """A module compiled against NumPy `built` runs on NumPy `running`: the same major
    version, not older (NumPy's C API is backward compatible within a major version)."""
    def parts(v: str) -> Tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", v)[:3])
    b, r = parts(str(built)), parts(str(running))
    return bool(b) and bool(r) and b[0] == r[0] and b <= r


def shipped_roots() -> List[Path]:
    """The shipped folders, in search order; none with OPKIT_PREBUILT=0 (every module is then
    compiled into the user's cache, as without them)."""
    if os.environ.get("OPKIT_PREBUILT", "").strip() == "0":
        return []
    from .._paths import prebuilt_dir
    own = prebuilt_dir()
    return [p for p in ([own] if own else []) + _SHIPPED if p.is_dir()]


def shipped_entries(name: str) -> List[Tuple[Path, dict]]:
    """The entries of operator `name` in the shipped folders, in search order."""
    found = []
    for root in shipped_roots():
        with contextlib.suppress(OSError):
            for p in sorted(root.glob(f"{name}-*")):
                meta = read_meta(p) if _ENTRY.match(p.name) else None
                if meta:
                    found.append((p, meta))
    return found


def cache_key(material: dict) -> str:
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def entry_dir(name: str, key: str) -> Path:
    return cache_root() / f"{name}-{key[:16]}"


def lock_path(entry_name: str) -> Path:
    return cache_root() / f".{entry_name}.lock"


def unwritable(exc: OSError) -> BuildError:
    """The one-line error for a cache folder that cannot be written."""
    where = f": {exc.filename}" if exc.filename else ""
    return BuildError(f"the kernel cache {cache_root()} cannot be written ({exc.strerror or exc}"
                      f"{where}); set OPKIT_CACHE_DIR to a folder you can write, or make this one "
                      "writable")


def entries(name: str) -> List[Tuple[Path, dict]]:
    """The entries of operator `name` that have a meta.json, newest first."""
    root = cache_root()
    found = []
    with contextlib.suppress(OSError):
        for p in root.glob(f"{name}-*"):
            meta = read_meta(p) if _ENTRY.match(p.name) else None
            if meta:
                found.append((str(meta.get("built", "")), p.name, p, meta))
    return [(p, meta) for *_, p, meta in sorted(found, key=lambda t: t[:2], reverse=True)]


def recorded_vector_bytes(material: dict) -> Optional[int]:
    """The vector width that the newest module built with this compiler-free toolchain material
    was annotated with (its compiler chose it), or None."""
    roots = [cache_root()] + shipped_roots()
    return _recorded_width(tuple(map(str, roots)), json.dumps(material, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _recorded_width(roots: Tuple[str, ...], material: str) -> Optional[int]:
    want = loose(json.loads(material))
    best: Tuple[str, Optional[int]] = ("", None)
    for root in roots:
        with contextlib.suppress(OSError):
            for p in Path(root).iterdir():
                meta = (read_meta(p) if _ENTRY.match(p.name) else None) or {}
                content = meta.get("content") or {}
                if loose(content.get("toolchain")) == want and \
                        isinstance(content.get("vector_bytes"), int):
                    best = max(best, (str(meta.get("built", "")), content["vector_bytes"]))
        if best[1] is not None:
            return best[1]  # the user's cache first, then the shipped folders in order
    return best[1]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _identity(st: os.stat_result) -> tuple:
    # unchanged across the rename into the cache; any rewrite changes the size or the mtime
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_record(path: Path) -> dict:
    """Size and sha256 of a file just built (remembered as checked for this process)."""
    st = path.stat()
    digest = file_sha256(path)
    _VERIFIED[_identity(st)] = digest
    return {"size": st.st_size, "sha256": digest}


def verify(entry: Path, meta: dict) -> str:
    """"" when the module and source of an entry match their recorded size and sha256, else what
    is wrong. Each file is hashed once per process."""
    files = meta.get("files")
    if not isinstance(files, dict) or meta.get("so") not in files or meta.get("pyx") not in files:
        return "meta.json records no size and sha256 of its files"
    for fname, record in sorted(files.items()):
        if not isinstance(record, dict) or Path(fname).name != fname or fname in ("", ".", ".."):
            return f"meta.json has a bad record for {fname!r}"
        path = entry / fname
        try:
            st = path.stat()
            if st.st_size != record.get("size"):
                return f"{fname} has {st.st_size} bytes, {record.get('size')} were written"
            if _VERIFIED.get(_identity(st)) != record.get("sha256"):
                if file_sha256(path) != record.get("sha256"):
                    return f"{fname} differs from the sha256 recorded when it was built"
                _VERIFIED[_identity(st)] = record["sha256"]
        except OSError as exc:
            return f"{fname} cannot be read: {exc.strerror or exc}"
    return ""


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
def try_lock(path: Path) -> Iterator[bool]:
    """Hold the lock at `path` for the block if nobody holds it: True; False if someone does (a
    build is running). An absent lock file is free. Without fcntl, always True."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            import fcntl
        except ImportError:
            yield True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


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
_LEFTOVER = re.compile(r"(\.tmp-|\.trash-|failed-)(?P<entry>[a-z][a-z0-9_]*-[0-9a-f]{16})(-(?P<pid>\d+)-\d+)?\Z")
_LOCK = re.compile(r"\.(?P<entry>[a-z][a-z0-9_]*-[0-9a-f]{16})\.lock\Z")


def _owner_alive(pid: Optional[str]) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):
        return True  # it exists (another user's) or cannot be asked: keep its files
    return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def clean(stale_only: bool = False) -> int:
    """Remove cache entries (or only leftovers of interrupted builds); returns how many.

    Only names opkit itself creates are touched, whatever folder OPKIT_CACHE_DIR points at. The
    folders of a build that is still running (its lock is held, or the process named in the
    folder's name is alive) are never touched."""
    root = cache_root()
    if not root.is_dir():
        return 0
    removed = 0
    for p in sorted(root.iterdir()):
        leftover, lock = _LEFTOVER.match(p.name), _LOCK.match(p.name)
        if stale_only and not leftover or not (leftover or lock or _ENTRY.match(p.name)):
            continue
        named = leftover or lock
        entry = named.group("entry") if named else p.name
        try:
            with try_lock(root / f".{entry}.lock") as free:
                if not free or leftover and _owner_alive(leftover.group("pid")):
                    continue
                _remove(p)
        except FileNotFoundError:
            continue  # it finished (or was cleaned) meanwhile
        except OSError as exc:
            raise unwritable(exc) from None
        removed += 1
    return removed
