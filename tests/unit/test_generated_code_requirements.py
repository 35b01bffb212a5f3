"""The generated `ctxcc.v1` code refuses to import on a protobuf or grpcio runtime older
than the one it was generated for (protobuf: also another major version). The Python
client's wheel carries that code, so its declared dependencies must not admit such a
runtime: pip would install the wheel beside an older grpcio or protobuf already in the
user's environment, and `import ctxcc_client` would then fail. The daemon's own
requirements likewise."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "ctxcc" / "v1"
PYPROJECTS = [REPO / "pyproject.toml", REPO / "client" / "python" / "pyproject.toml"]


def _protobuf_gencode() -> Version:
    """The highest protobuf version any generated module asks of its runtime."""
    found = set()
    for path in GENERATED.glob("*_pb2.py"):
        m = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
            r"(\d+),\s*(\d+),\s*(\d+),",
            path.read_text(),
        )
        assert m, f"{path.name} has no runtime version check"
        found.add(Version(".".join(m.groups())))
    assert found
    return max(found)


def _grpc_generated() -> Version:
    found = set()
    for path in GENERATED.glob("*_pb2_grpc.py"):
        m = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", path.read_text())
        if m:
            found.add(Version(m.group(1)))
    assert found
    return max(found)


def _requirement(pyproject: Path, name: str) -> Requirement:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    reqs = [Requirement(d) for d in deps if Requirement(d).name == name]
    assert len(reqs) == 1, f"{pyproject}: {name} is not a dependency"
    return reqs[0]


def _just_below(v: Version) -> list[Version]:
    major, minor, patch = v.release[:3]
    below = [Version(f"{major - 1}.999.999"), Version(f"{major}.{minor}.0")]
    if minor:
        below.append(Version(f"{major}.{minor - 1}.999"))
    if patch:
        below.append(Version(f"{major}.{minor}.{patch - 1}"))
    return sorted({b for b in below if b < v})


def _admits_from(spec: SpecifierSet, package: str, gen: Version) -> None:
    """`spec` admits `gen`, the version the generated code was made for, and none just
    below it."""
    assert spec.contains(gen), f"{spec} refuses {package} {gen}, the generated code's own"
    refused = [v for v in _just_below(gen) if spec.contains(v)]
    assert not refused, f"{spec} admits {package} {refused}, older than the generated code's {gen}"


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.relative_to(REPO)))
def test_protobuf_requirement_admits_only_runtimes_the_generated_code_accepts(
    pyproject: Path,
) -> None:
    gen = _protobuf_gencode()
    spec = _requirement(pyproject, "protobuf").specifier
    _admits_from(spec, "protobuf", gen)
    nxt = Version(f"{gen.major + 1}.0.0")
    assert not spec.contains(nxt), f"{spec} admits protobuf {nxt}: another major"


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.relative_to(REPO)))
def test_grpcio_requirement_admits_only_runtimes_the_generated_code_accepts(
    pyproject: Path,
) -> None:
    _admits_from(_requirement(pyproject, "grpcio").specifier, "grpcio", _grpc_generated())
