"""Harnesses that run exported tasks: an Inspect AI task and a verifiers environment (each imports its
framework; nothing else in Vigil imports them). The grading both apply is :mod:`vigil.export.checks`."""

from __future__ import annotations

from pathlib import Path

INSPECT_TASK = Path(__file__).with_name("inspect_task.py")
VERIFIERS_ENV = Path(__file__).with_name("verifiers_env.py")
