"""Presentation: text builders in the semantic-lines idiom, shared by the UI, the CLI and the report.

Each builder turns analysis results into lines of ``(text, style-name)`` segments (or Rich text
for the GPU and host panels); the UI maps style names to colours, the CLI prints the text, tests
read it plainly. Nothing here imports Textual, NVML, psutil or the record layer; the units
(``gputop.units``: sizes, rates, durations, bars, sparklines) sit below, for the rules too.

- ``panels``: the header, the GPU panels and the host panel
- ``gpu_charts``: a GPU panel's history charts and their legend; ``plot`` their drawing math
  (max/min buckets, eighth blocks); ``idle_causes`` the idle columns' causes, from the advisor's
  attribution
- ``process_table``: rows and columns of the process table
- ``stacks``: the Stacks pane and ``gputop stacks``
- ``advice``: findings and time breakdowns (the Advisor pane, ``advise``, JSON)
- ``ranks``: the Ranks pane; ``job``: a job across hosts (``gputop job``)
- ``rules``: the advisor's rules and their thresholds with their provenance (``gputop rules``)

This is its face: the layers above import from here, never from its modules (an import-linter
contract keeps it so). The three panes' builders have distinct names here (``advice_pane_lines``,
``stacks_pane_lines``, ``ranks_pane_lines``), so an importer never has to rename one.
"""

from __future__ import annotations

from .advice import (
    BUCKET_CHAR, advice_pane_lines, bar_text, breakdown_dict, breakdown_rows, breakdown_table, device_name,
    finding_dict, finding_gpu, finding_starts, findings_text, report_dict, session_start_in, verdict_line,
)
from .gpu_charts import split_width
from .idle_causes import column_causes
# ``plain`` alone would be ambiguous: stacks has a plain of its own (trailing spaces stripped).
from .job import header_lines, job_lines, jobs_lines, plain as job_plain, rank_lines, verdict_lines
from .panels import (
    CHARTS, COMPACT, FULL, MEDIUM, PANEL_LINES, History, gpu_panel_lines, header_text, held_back_text, no_gpu_text,
    hidden_gpus_line, host_panel_lines, index_width, sampling_text,
)
from .process_table import (
    COLUMNS, DESCENDING_BY_DEFAULT, SORT_KEYS, ProcRow, attachable, build_rows, row_cells, shown_command, table_columns,
)
from .ranks import ranks_pane_lines, ranks_waiting_lines
from .rules import rules_dict, rules_text
from .stacks import Line, dump_dict, dump_text, stacks_pane_lines, stacks_waiting_lines

__all__ = [
    "BUCKET_CHAR", "CHARTS", "COLUMNS", "COMPACT", "DESCENDING_BY_DEFAULT", "FULL", "History", "Line", "MEDIUM",
    "PANEL_LINES", "ProcRow", "SORT_KEYS", "advice_pane_lines", "attachable", "bar_text", "breakdown_dict",
    "breakdown_rows", "breakdown_table", "build_rows", "column_causes", "device_name", "dump_dict", "dump_text",
    "finding_dict", "finding_gpu", "finding_starts", "findings_text", "gpu_panel_lines", "header_lines", "header_text", "held_back_text", "no_gpu_text",
    "hidden_gpus_line", "host_panel_lines", "index_width", "job_lines", "job_plain", "jobs_lines", "rank_lines", "ranks_pane_lines",
    "ranks_waiting_lines", "report_dict", "row_cells", "rules_dict", "rules_text", "sampling_text", "session_start_in", "shown_command", "split_width", "stacks_pane_lines",
    "stacks_waiting_lines", "table_columns",
    "verdict_line", "verdict_lines",
]
