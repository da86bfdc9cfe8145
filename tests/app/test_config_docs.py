"""docs/configuration.md documents every setting with its default, and is the only copy of the table."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| ([^|]*) \|", re.M)


def table_rows(path: Path) -> dict[str, str]:
    """`VARIABLE` -> default cell, from the Markdown table rows of a document."""
    return {m.group(1): m.group(2).strip() for m in ROW.finditer(path.read_text(encoding="utf-8"))}


def documented_default(value: object) -> str:
    if value is None or value == "":
        return "*"  # "*(unset)*", "*(empty)*", or a device-dependent default in words
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def test_every_setting_is_documented_with_its_default():
    rows = table_rows(DOC)
    fields = Settings.model_fields
    missing = sorted(name.upper() for name in fields if name.upper() not in rows)
    assert not missing, f"{DOC.name} lacks rows for {missing}"
    stale = sorted(set(rows) - {name.upper() for name in fields})
    assert not stale, f"{DOC.name} documents settings that do not exist: {stale}"
    for name, info in fields.items():
        default = info.default.name if isinstance(info.default, Path) else info.default
        if hasattr(default, "get_secret_value"):
            default = None
        assert rows[name.upper()].startswith(documented_default(default)), (name, rows[name.upper()])


def test_no_other_document_keeps_a_copy_of_the_table():
    settings = {name.upper() for name in Settings.model_fields}
    docs = [p for p in ROOT.glob("**/*.md") if ".venv" not in p.parts and ".cache" not in p.parts]
    copies = {
        str(p.relative_to(ROOT)): len(settings & set(table_rows(p)))
        for p in docs
        if p != DOC and len(settings & set(table_rows(p))) > 3
    }
    assert not copies, f"settings tables outside docs/configuration.md (link to it instead): {copies}"
