"""How a decoded answer is judged against its references: RULER's postprocessing and string match."""

from __future__ import annotations

import re


def clean(output: str) -> str:
    """RULER's postprocessing: control characters become new lines, the ends are stripped."""
    return re.sub(r"[\x00-\x1f]", "\n", output.strip()).strip()


def references_found(output: str, answers: tuple[str, ...]) -> list[bool]:
    """Per reference, whether the output holds it (case-insensitive): string_match_all is their
    mean, string_match_part (RULER's metric for its QA tasks) their maximum."""
    said = clean(output).lower()
    return [a.lower() in said for a in answers]
