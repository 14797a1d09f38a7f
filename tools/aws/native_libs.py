"""Whether every shared library of a Lambda package loads on Lambda's Python 3.12 runtime.

The runtime is Amazon Linux 2023: glibc 2.34 and GCC 11's libstdc++ ("Lambda runtimes": python3.12 on Amazon Linux
2023). What a library may assume of it is taken from auditwheel's ``manylinux_2_34`` policy (the libraries any
manylinux_2_34 system has and the newest symbol versions of glibc 2.34 and of GCC 11's libstdc++, libgcc and
libatomic), less the desktop libraries that policy also allows (X11, OpenGL, GLib) and Lambda's base image does not
install. Anything else a library needs must come in the package itself; a version newer than those must not be
needed at all. ``libgomp.so.1`` (OpenMP), for one, is neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

RUNTIME_POLICY = "manylinux_2_34"
DESKTOP_LIBRARIES = ("libX", "libICE", "libSM", "libGL", "libgobject", "libgthread", "libglib")


@dataclass(frozen=True)
class Runtime:
    libraries: frozenset[str]  # what the runtime has, by soname
    versions: dict[str, frozenset[str]]  # symbol version family (GLIBC, GLIBCXX, ...) -> the versions it provides


@cache
def lambda_python_runtime() -> Runtime:
    """Lambda's python3.12 runtime as auditwheel's manylinux_2_34 policy describes it, less the desktop libraries."""
    policies = json.loads(resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text())
    [policy] = [p for p in policies if p["name"] == RUNTIME_POLICY]
    return Runtime(
        libraries=frozenset(lib for lib in policy["lib_whitelist"] if not lib.startswith(DESKTOP_LIBRARIES)),
        versions={family: frozenset(v) for family, v in policy["symbol_versions"]["x86_64"].items()},
    )


def _needs(library: Path) -> tuple[list[str], list[str]]:
    """The sonames ``library`` needs (DT_NEEDED) and the symbol versions it requires of them (GLIBC_2.34, ...)."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with library.open("rb") as file:
        elf = ELFFile(file)
        needed, versions = [], []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed += [tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]
            elif isinstance(section, GNUVerNeedSection):
                versions += [aux.name for _, auxiliaries in section.iter_versions() for aux in auxiliaries]
    return needed, versions


def _is_elf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == b"\x7fELF"


def problems(package: Path, runtime: Runtime | None = None) -> list[str]:
    """What would keep a shared library of ``package`` (a function's folder or a layer's) from loading there, one
    line each, naming the library; ``runtime`` defaults to Lambda's python3.12."""
    runtime = runtime or lambda_python_runtime()
    libraries = [p for p in sorted(package.rglob("*.so*")) if p.is_file() and not p.is_symlink() and _is_elf(p)]
    shipped = {p.name for p in package.rglob("*.so*")}
    found = []
    for library in libraries:
        needed, versions = _needs(library)
        name = library.relative_to(package)
        for soname in needed:
            if soname not in shipped and soname not in runtime.libraries and not soname.startswith("ld-linux"):
                found.append(f"{name} needs {soname}, which is neither in the package nor in the runtime")
        for version in sorted(set(versions)):
            family, _, number = version.partition("_")
            if family in runtime.versions and number not in runtime.versions[family]:
                newest = max(runtime.versions[family], key=_version_key)
                found.append(f"{name} needs {version}, newer than the runtime's {family}_{newest}")
    return found


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def main(folders: list[str]) -> int:
    """`python -m tools.aws.native_libs FOLDER...`: each problem in a line; 1 when there is any (a build step fails)."""
    found = [f"{folder}: {problem}" for folder in folders for problem in problems(Path(folder))]
    print("\n".join(found) or f"every shared library of {', '.join(folders)} loads on Lambda's python3.12 runtime")
    return 1 if found else 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
