"""The real validators pass on the real files: cfn-lint on the template, asl-validator on the workflow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tools.local.workflow import placeholders, substitute


def test_cfn_lint_passes_on_the_template() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), str(REPO / "template.yaml")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variants", [False, True])
def test_asl_validator_passes_on_the_workflow_as_each_deployment_fills_it(variants: bool, tmp_path: Path) -> None:
    validator = REPO / "node_modules" / ".bin" / "asl-validator"
    assert validator.exists() and shutil.which("node"), "run scripts/install.sh: it installs asl-validator"
    # The placeholders as template.yaml fills them: the children's type and the Variants integration differ
    filled = {name: f"arn:aws:lambda:eu-central-1:123456789012:function:{name}" for name in placeholders()}
    filled |= {
        "ResultsBucket": "annotate-results",
        "Partition": "aws",
        "GroupExecutionType": "STANDARD" if variants else "EXPRESS",
        "VariantsResource": "arn:aws:states:::ecs:runTask" + (".sync" if variants else ""),
        "TaskPublicIp": "ENABLED",
    }
    definition = tmp_path / "pipeline.asl.json"
    definition.write_text(substitute(filled))
    result = subprocess.run(
        [str(validator), "--json-path", str(definition)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
