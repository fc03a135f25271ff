"""The subcommands, one module each (``register`` and ``run``).

Imported first of gputop's own modules when the command line starts: from here on, a stop signal
that arrives while the rest loads is held for the command (``startup_signals``).
"""

from . import startup_signals

if startup_signals.is_gputop_process():
    startup_signals.hold()
