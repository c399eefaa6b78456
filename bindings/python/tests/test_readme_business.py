"""The snippets of "For API businesses" in docs/features.md (plans, overrides, shadow mode,
near-limit events, reserve and settle, window offsets), run as written: each holds asserts of
its own, so a snippet that no longer does what the page says fails here."""

from __future__ import annotations

import pathlib
import re

import pytest

FEATURES = pathlib.Path(__file__).resolve().parents[3] / "docs" / "features.md"


def business_snippets() -> list[tuple[str, str]]:
    text = FEATURES.read_text(encoding="utf-8")
    start = text.index("## For API businesses")
    end = text.find("\n## ", start + 1)
    section = text[start:] if end < 0 else text[start:end]
    found: list[tuple[str, str]] = []
    heading = ""
    for part in re.split(r"^(### .*)$", section, flags=re.M):
        if part.startswith("### "):
            heading = part[4:].strip()
            continue
        for code in re.findall(r"```python\n(.*?)```", part, flags=re.S):
            found.append((heading, code))
    return found


SNIPPETS = business_snippets()


def test_every_feature_has_a_snippet() -> None:
    headings = [h for h, _ in SNIPPETS]
    assert headings == [
        "Plans and rate strings",
        "Live per-key overrides",
        "Shadow mode and near-limit events",
        "Charge, refund, reserve and settle",
        "Window offsets and exact rates",
    ], headings


@pytest.mark.parametrize("heading,code", SNIPPETS, ids=[h for h, _ in SNIPPETS])
def test_snippet_runs_as_written(heading: str, code: str) -> None:
    exec(compile(code, f"docs/features.md ({heading})", "exec"), {"__name__": "readme"})
