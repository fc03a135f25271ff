"""Errors meant for the user: printed as one line, never as a traceback."""


class UserError(Exception):
    """Bad input or an unusable environment. ``str(exc)`` is the whole message."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
