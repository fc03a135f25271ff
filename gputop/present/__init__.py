"""Presentation: text builders in the semantic-lines idiom, shared by the UI, the CLI and the report.

Each builder turns analysis results into lines of ``(text, style-name)`` segments (or Rich text
for the GPU and host panels); the UI maps style names to colours, the CLI prints the text, tests
read it plainly. Nothing here imports Textual, NVML, psutil or the record layer; the units
(``gputop.units``: sizes, rates, durations, bars, sparklines) sit below, for the rules too.

- ``panels``: the header, the GPU panels and the host panel
- ``process_table``: rows and columns of the process table
- ``stacks``: the Stacks pane and ``gputop stacks``
- ``advice``: findings and time breakdowns (the Advisor pane, ``advise``, JSON)
"""
