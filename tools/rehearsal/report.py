"""What a rehearsal found: the steps it played, what failed, the requests it checked, what it could not rehearse."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tools.rehearsal.aws_requests import SeenRequest
from tools.rehearsal.iam import Statement
from tools.rehearsal.stack import Deployment

NEVER_REHEARSED = (
    "the layers' and images' contents: handlers run with this environment's packages (make sam-build builds "
    "the layers, scripts/package.py checks their native libraries against Lambda's runtime; the images need a "
    "Docker engine)",
    "calls AWS services make on their own behalf: Step Functions' log delivery, Fargate's image pull and logs",
    "quotas and cold starts of the real services (their throttles and errors are injected by make chaos)",
)


@dataclass
class Report:
    deployment: Deployment
    steps: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unused_statements: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    not_rehearsed: list[str] = field(default_factory=list)
    requests: list[SeenRequest] = field(default_factory=list)
    policies: dict[str, list[Statement]] = field(default_factory=dict)  # principal -> its statements

    @property
    def ok(self) -> bool:
        return not self.failures

    def step(self, what: str, since: float) -> None:
        self.steps.append(f"{what} ({time.monotonic() - since:.1f} s)")

    def check(self, condition: bool, failure: str) -> bool:
        if not condition:
            self.failures.append(failure)
        return condition

    def render(self) -> str:
        parameters = ", ".join(f"{k}={v}" for k, v in self.deployment.parameters.items()) or "none"
        lines = [f"## {self.deployment.stack_name} in {self.deployment.region} (parameters: {parameters})", ""]
        lines += [f"- {step}" for step in self.steps]
        lines += ["", f"IAM: {len(self.requests)} requests checked against their principal's deployed policies."]
        lines += ["", "Created through service APIs (moto's CloudFormation does not):"]
        lines += [f"  - {item}" for item in self.completed]
        lines += ["", "Resources not rehearsed:"] + [f"  - {item}" for item in self.not_rehearsed or ["none"]]
        lines += ["", "Never rehearsed here:"] + [f"  - {item}" for item in NEVER_REHEARSED]
        lines += ["", "Statements no request used:"] + [f"  - {s}" for s in self.unused_statements or ["none"]]
        lines += ["", "FAILURES:" if self.failures else "Passed."] + [f"  - {f}" for f in self.failures]
        return "\n".join(lines)
