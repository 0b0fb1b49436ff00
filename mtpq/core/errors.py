"""The one base of mtpq's errors: bad input or a failed step, said in one line. Both command lines
(apply.py, mtpq) catch it and print `error: <message>`."""


class MtpqError(Exception):
    """Every error mtpq reports to its user; each concern's errors derive from it."""
