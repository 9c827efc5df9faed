"""The one kind of error a user can cause and fix: a bad config, path, data set or resume.

Its message is one line naming what is wrong and what is allowed. Entry points print it
as ``error: <message>`` and exit with status 2, without a traceback.
"""


class UserError(ValueError):
    """A mistake in the user's input; the message is one line."""
