"""scripts/gpu_session.sh, the GPU checks run on a lent device: it parses, refuses an unknown
part with the list of parts, and every part it runs is documented in its header and in
posbench/docs/gpu.md (its SMOKE=1 runs on CPU are too slow for the suite)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_session.sh"


def parts() -> list[str]:
    return re.findall(r"(?m)^([a-z]+)\)$", SCRIPT.read_text())


def test_the_script_parses_and_refuses_an_unknown_part(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    done = subprocess.run(["bash", str(SCRIPT), "nosuchpart", str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2
    assert "unknown part: nosuchpart" in done.stdout + done.stderr
    for part in parts():
        assert part in done.stdout + done.stderr


def test_every_part_is_documented():
    header = SCRIPT.read_text().split("set -euo pipefail")[0]
    manual = (REPO / "posbench" / "docs" / "gpu.md").read_text()
    assert len(parts()) >= 7
    for part in parts():
        assert f"gpu_session.sh {part}" in header, part
        assert f"gpu_session.sh {part}" in manual, part
