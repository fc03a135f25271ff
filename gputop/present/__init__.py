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
"""
