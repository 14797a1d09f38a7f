"""The real validators pass on the real files: cfn-lint on the template, asl-validator on the workflow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tools.workflow import DEFINITION_PATH


def test_cfn_lint_passes_on_the_template() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), str(REPO / "template.yaml")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_asl_validator_passes_on_the_workflow() -> None:
    validator = REPO / "node_modules" / ".bin" / "asl-validator"
    assert validator.exists() and shutil.which("node"), "run scripts/install.sh: it installs asl-validator"
    result = subprocess.run(
        [str(validator), "--json-path", str(DEFINITION_PATH)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
