"""`opkit package DIR -o DIST`: a folder of YAML operators as an installable wheel.

The wheel holds a Python package (`<package>/__init__.py` naming its two folders), the
declarations (`<package>/operators/*.yaml`), the modules built ahead of time
(`<package>/prebuilt/<op>-<key>/`) and an entry point in the group `opkit.operators`, through
which `import opkit` finds and registers the operators (opkit/packaging/plugins.py). It is
written directly (a wheel is a zip file with a .dist-info folder), so packaging needs no build
tool besides the C compiler.
"""
from __future__ import annotations

import base64
import hashlib
import re
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .._version import __version__

GROUP = "opkit.operators"
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?\Z")
_VERSION = re.compile(r"\d+(\.\d+)*([abc]|rc|\.post|\.dev)?\d*\Z")

_INIT = '''"""opkit operators: {names} (a package made by `opkit package`).

`import opkit` registers them through the entry point group opkit.operators."""
from pathlib import Path

OPERATORS = Path(__file__).resolve().parent / "operators"   # the declarations
PREBUILT = Path(__file__).resolve().parent / "prebuilt"     # modules built ahead of time
'''


def names_for(folder: Path, name: Optional[str]):
    """(distribution name, import package name) for a folder, checked."""
    dist = name or folder.resolve().name.replace("_", "-")
    if not _NAME.match(dist):
        raise ValueError(f"package name {dist!r} is not a valid distribution name (letters, "
                         "digits, '.', '-', '_'); give one with --name")
    package = re.sub(r"[^a-z0-9]+", "_", dist.lower()).strip("_")
    if not package or package[0].isdigit() or package in ("opkit",):
        package = f"opkit_ops_{package}"
    return dist, package


def wheel_tag(pure: bool) -> str:
    """py3-none-any, or this interpreter's and platform's tag when modules are inside."""
    if pure:
        return "py3-none-any"
    v = sys.version_info
    abi = f"cp{v.major}{v.minor}" + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"cp{v.major}{v.minor}-{abi}-{plat}"


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def write_wheel(out_dir: Path, dist: str, version: str, package: str, operators: Sequence[Path],
                prebuilt: Optional[Path], summary: str) -> Path:
    """Write the wheel into `out_dir` and return its path."""
    if not _VERSION.match(version):
        raise ValueError(f"version {version!r} is not a version number such as 1.0 or 0.2.1")
    files: Dict[str, bytes] = {f"{package}/__init__.py": _INIT.format(names=summary).encode()}
    for path in operators:
        files[f"{package}/operators/{path.name}"] = path.read_bytes()
    pure = prebuilt is None or not any(prebuilt.iterdir())
    if not pure:
        for path in sorted(prebuilt.rglob("*")):
            if path.is_file():
                files[f"{package}/prebuilt/{path.relative_to(prebuilt).as_posix()}"] = path.read_bytes()
    escaped = re.sub(r"[-_.]+", "_", dist)
    info = f"{escaped}-{version}.dist-info"
    tag = wheel_tag(pure)
    py = sys.version_info
    requires_python = ">=3.9" if pure else f"=={py.major}.{py.minor}.*"
    files[f"{info}/METADATA"] = "\n".join([
        "Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}",
        f"Summary: opkit operators: {summary}", f"Requires-Python: {requires_python}",
        # the shipped modules match this opkit's templates and code generation exactly
        f"Requires-Dist: opkit=={__version__}", "", ""]).encode()
    files[f"{info}/WHEEL"] = "\n".join([
        "Wheel-Version: 1.0", f"Generator: opkit {__version__}",
        f"Root-Is-Purelib: {'true' if pure else 'false'}", f"Tag: {tag}", "", ""]).encode()
    files[f"{info}/entry_points.txt"] = f"[{GROUP}]\n{package} = {package}\n".encode()
    record: List[str] = [_record_line(a, d) for a, d in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{escaped}-{version}-{tag}.whl"
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            entry = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            zf.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(path)
    return path
