"""The client library as its own distribution (client/pyproject.toml): its wheel holds the client and
the wire formats and nothing of the server, needs only anyio, attrs and protobuf, and imports alone."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_client_wheel_holds_the_client_alone_and_imports_on_its_own(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT / "client")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("streaming_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
        archive.extractall(tmp_path / "unpacked")
    packages = {n.split("/")[1] for n in names if n.startswith("streaming/")}
    assert packages == {"client", "wire"} and "streaming/__init__.py" not in names
    assert not [n for n in names if n.startswith("storage/")]
    assert sorted(r.split(">")[0].split("=")[0].strip() for r in requires) == ["anyio", "attrs", "protobuf"]
    # Only the unpacked wheel and the installed dependencies on the path (no site processing: the
    # checkout, which an editable install puts there, stays out).
    site = sysconfig.get_paths()["purelib"]
    code = (
        "import sys; import streaming.client, streaming.wire.handshake; "
        "assert streaming.client.__file__.startswith(sys.argv[1]), streaming.client.__file__; "
        "assert not [m for m in sys.modules if m.startswith(('storage', 'streaming.core', 'trio', 'lmdb'))]"
    )
    env = {"PYTHONPATH": f"{tmp_path / 'unpacked'}:{site}"}
    unpacked = str(tmp_path / "unpacked")
    subprocess.run([sys.executable, "-S", "-c", code, unpacked], check=True, env=env, cwd=tmp_path, timeout=60)
