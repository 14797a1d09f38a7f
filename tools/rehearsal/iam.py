"""IAM identity-policy evaluation for the requests the rehearsal records.

moto evaluates actions only, not resources or conditions, so a least-privilege check needs its own evaluation.
This follows IAM's rules for identity policies: an explicit Deny wins, else an Allow whose action, resource and
every condition match, else the implicit deny. Wildcards are IAM's (``*`` any run of characters, ``?`` one;
actions case-insensitive, resources not). A missing condition key fails a condition, except for the negated
operators, ``...IfExists`` and ``Null``. An operator this module does not know is an error, never a match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Request:
    """One AWS call as IAM sees it."""

    principal: str  # the function (or role) that made it, by its template name
    action: str  # "s3:ListBucket"
    resource: str  # an ARN, or "*" for actions that take none
    context: Mapping[str, str] = field(default_factory=dict)  # condition keys: {"s3:prefix": "models/x/"}

    def __str__(self) -> str:
        keys = "".join(f" {key}={value!r}" for key, value in sorted(self.context.items()))
        return f"{self.principal}: {self.action} on {self.resource}{keys}"


@cache
def _wildcard(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    # fnmatch would also read [..] as a character class; IAM has only * and ?.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def wildcard_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    return bool(_wildcard(pattern, ignore_case).match(value))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _arn_like(pattern: str, value: str) -> bool:
    # ARNs are compared part by part: a * in one part does not reach into the next.
    pattern_parts, value_parts = pattern.split(":", 5), value.split(":", 5)
    return len(pattern_parts) == len(value_parts) and all(
        wildcard_match(p, v) for p, v in zip(pattern_parts, value_parts, strict=True)
    )


_OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda expected, actual: expected == actual,
    "StringEqualsIgnoreCase": lambda expected, actual: expected.lower() == actual.lower(),
    "StringLike": lambda expected, actual: wildcard_match(expected, actual),
    "ArnEquals": lambda expected, actual: expected == actual,
    "ArnLike": _arn_like,
    "Bool": lambda expected, actual: str(expected).lower() == str(actual).lower(),
}
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


class UnknownConditionOperator(ValueError):
    pass


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, str]) -> bool:
    if operator == "Null":
        return (key not in context) == (str(expected).lower() == "true")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if key not in context:
        return if_exists or base in _NEGATED
    actual = context[key]
    if base in _NEGATED:
        return not any(_OPERATORS[_NEGATED[base]](str(e), actual) for e in _as_list(expected))
    if base not in _OPERATORS:
        raise UnknownConditionOperator(f"condition operator {operator} is not evaluated here; add it to iam.py")
    return any(_OPERATORS[base](str(e), actual) for e in _as_list(expected))


@dataclass(frozen=True)
class Statement:
    policy: str  # the policy it belongs to: an inline policy's name or a managed policy's ARN
    index: int
    document: Mapping[str, Any]

    @property
    def name(self) -> str:
        return f"{self.policy}#{self.document.get('Sid') or self.index}"

    @property
    def effect(self) -> str:
        return str(self.document["Effect"])

    def _actions_match(self, action: str) -> bool:
        if "NotAction" in self.document:
            return not any(wildcard_match(a, action, True) for a in _as_list(self.document["NotAction"]))
        return any(wildcard_match(a, action, True) for a in _as_list(self.document.get("Action", [])))

    def _resources_match(self, resource: str) -> bool:
        if "NotResource" in self.document:
            return not any(wildcard_match(r, resource) for r in _as_list(self.document["NotResource"]))
        return any(wildcard_match(r, resource) for r in _as_list(self.document.get("Resource", [])))

    def _conditions_hold(self, context: Mapping[str, str]) -> bool:
        return all(
            _condition_holds(operator, key, expected, context)
            for operator, keys in self.document.get("Condition", {}).items()
            for key, expected in keys.items()
        )

    def applies_to(self, request: Request) -> bool:
        return (
            self._actions_match(request.action)
            and self._resources_match(request.resource)
            and self._conditions_hold(request.context)
        )


def statements(policy: str, document: Mapping[str, Any]) -> list[Statement]:
    return [Statement(policy, index, s) for index, s in enumerate(_as_list(document.get("Statement", [])))]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    allowed_by: tuple[Statement, ...]
    denied_by: tuple[Statement, ...]


def evaluate(policy_statements: Iterable[Statement], request: Request) -> Decision:
    applying = [s for s in policy_statements if s.applies_to(request)]
    denies = tuple(s for s in applying if s.effect == "Deny")
    allows = tuple(s for s in applying if s.effect == "Allow")
    return Decision(allowed=bool(allows) and not denies, allowed_by=allows, denied_by=denies)
