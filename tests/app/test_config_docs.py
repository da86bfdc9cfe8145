"""The configuration tables in README.md and app/README.md document every setting, with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def table_rows(path: Path) -> dict[str, str]:
    """`VARIABLE` -> default cell, from the Markdown table under '## Configuration'."""
    text = path.read_text(encoding="utf-8")
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([A-Z0-9_]+)` \| ([^|]*) \|", section, re.M)
    }


def documented_default(value: object) -> str:
    if value is None or value == "":
        return "*"  # "*(unset)*", "*(empty)*", or a device-dependent default in words
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


@pytest.mark.parametrize("doc", ["README.md", "app/README.md"])
def test_every_setting_is_documented_with_its_default(doc):
    rows = table_rows(ROOT / doc)
    fields = Settings.model_fields
    missing = sorted(name.upper() for name in fields if name.upper() not in rows)
    assert not missing, f"{doc} lacks rows for {missing}"
    stale = sorted(set(rows) - {name.upper() for name in fields})
    assert not stale, f"{doc} documents settings that do not exist: {stale}"
    for name, info in fields.items():
        default = info.default.name if isinstance(info.default, Path) else info.default
        if hasattr(default, "get_secret_value"):
            default = None
        assert rows[name.upper()].startswith(documented_default(default)), (doc, name, rows[name.upper()])


def test_readme_copies_the_app_table():
    assert table_rows(ROOT / "README.md") == table_rows(ROOT / "app/README.md")
