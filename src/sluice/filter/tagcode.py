"""Tag codes: what the consume queue keeps for a message's tag.

They are part of the consume-queue format, so sluice.format owns them (the
store takes them from there); the filter package re-exports them here.
"""
from __future__ import annotations

from sluice.format import java_hash_of_code, java_string_hash, tag_code

__all__ = ["java_hash_of_code", "java_string_hash", "tag_code"]
