"""Small real PyTorch training jobs, each reproducing one well-known bottleneck.

``registry`` (no torch import) says what each scenario is and what gputop should find in it;
``python -m gputop.workloads SCENARIO`` runs one and prints progress lines (see ``protocol``).
They back ``gputop demo`` and the benchmark harness, and their CPU variants are CI smoke tests.
"""

from .protocol import PREFIX, Line, parse_line
from .registry import SCENARIOS, Scenario, get, names

__all__ = ["PREFIX", "Line", "SCENARIOS", "Scenario", "get", "names", "parse_line"]
