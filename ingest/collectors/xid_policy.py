"""The Xid policy: severity and recommended action per Xid code, as a versioned table, not code.

Public catalogues disagree on codes such as 61 and 63 (NVIDIA's catalogue, NVSentinel and the EKS
node agent each class them differently), so the table ships as package data
(``xid_policy.csv``, built from the project's reference catalogue) and an operator file with the
same columns is merged over it: a row there replaces the shipped row for its code, a column left
empty keeps the shipped value. The effective version names both, so an event's policy can be
traced to the exact tables that produced it.

CSV format: ``#`` comment lines (one may read ``# version: X``), then a header with at least
``xid``; optional columns ``mnemonic, severity, action, investigation, meaning``.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

__all__ = ["XidRule", "XidPolicy", "load_xid_policy"]

_VERSION_PREFIX = "# version:"
_COLUMNS = ("mnemonic", "severity", "action", "investigation", "meaning")


@dataclass(frozen=True, slots=True)
class XidRule:
    """What the policy says about one Xid code."""

    xid: int
    mnemonic: str = ""
    severity: str = "UNKNOWN"
    action: str = "CONTACT_SUPPORT"
    investigation: str = ""
    meaning: str = ""


class XidPolicy:
    """Lookup table from Xid code to :class:`XidRule`; codes not in the table get ``default``."""

    def __init__(self, rules: dict[int, XidRule], version: str, default: XidRule | None = None):
        self.rules = dict(rules)
        self.version = version
        self.default = default or XidRule(xid=-1)

    def lookup(self, xid: int) -> XidRule:
        rule = self.rules.get(xid)
        return rule if rule is not None else replace(self.default, xid=xid)

    def merged(self, override: XidPolicy) -> XidPolicy:
        """This policy with ``override``'s rows on top (empty override cells keep this policy's value)."""
        rules = dict(self.rules)
        for xid, rule in override.rules.items():
            base = rules.get(xid, XidRule(xid=xid))
            changes = {c: getattr(rule, c) for c in _COLUMNS if getattr(rule, c) != getattr(_BLANK, c)}
            rules[xid] = replace(base, **changes)
        return XidPolicy(rules, f"{self.version}+{override.version}", self.default)


_BLANK = XidRule(xid=-1, mnemonic="", severity="", action="", investigation="", meaning="")


def _parse(text: str, source: str) -> XidPolicy:
    version = "unversioned"
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            if line.lower().startswith(_VERSION_PREFIX):
                version = line[len(_VERSION_PREFIX):].strip() or version
            continue
        if line.strip():
            body.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    if reader.fieldnames is None or "xid" not in reader.fieldnames:
        raise ValueError(f"{source}: an Xid policy needs a header row with an 'xid' column")
    unknown = set(reader.fieldnames) - {"xid", *_COLUMNS}
    if unknown:
        raise ValueError(f"{source}: unknown policy columns {sorted(unknown)}")
    rules: dict[int, XidRule] = {}
    for row in reader:
        try:
            xid = int(row["xid"])
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}: line {reader.line_num}: xid {row['xid']!r} is not an integer"
            ) from None
        rules[xid] = XidRule(xid=xid, **{c: (row.get(c) or "").strip() for c in _COLUMNS})
    return XidPolicy(rules, version)


def load_xid_policy(override: Path | None = None) -> XidPolicy:
    """The shipped policy, with the operator's CSV merged over it when ``override`` is given."""
    table = resources.files("foreshock.ingest.collectors").joinpath("xid_policy.csv")
    shipped = table.read_text(encoding="utf-8")
    policy = _parse(shipped, "xid_policy.csv")
    policy = XidPolicy({x: _fill(r) for x, r in policy.rules.items()}, f"builtin-{policy.version}")
    if override is None:
        return policy
    return policy.merged(_parse(Path(override).read_text(encoding="utf-8"), str(override)))


def _fill(rule: XidRule) -> XidRule:
    """Shipped rows with an empty severity or action fall back to the defaults."""
    return replace(rule, severity=rule.severity or "UNKNOWN", action=rule.action or "CONTACT_SUPPORT")
