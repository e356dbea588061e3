"""Workflows: steps that wait for each other, built in canvas.py, read back in results.py,
kept in the database as workflows/fields.py says (their writes: managers/deps.py).

    from django_jobstate.workflows import chain, chord, group, step

    chain(step(fetch, url), step(parse).receive("html")).enqueue()
    chord(group(step(resize, path, size) for size in SIZES), step(publish)).enqueue()
"""

from .canvas import Chain, Chord, Group, Step, chain, chord, group, step
from .results import WorkflowResult, get_workflow

__all__ = [
    "Chain",
    "Chord",
    "Group",
    "Step",
    "WorkflowResult",
    "chain",
    "chord",
    "get_workflow",
    "group",
    "step",
]
