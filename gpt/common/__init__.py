"""What every wing shares: the error a user can cause (``UserError``, one line) and calls bounded in time.

Owns: ``errors`` (UserError, first_line, os_reason), ``bounded`` (``within``: a call given up on after a
deadline; ``leave``: an exit that does not wait for it).
May import: nothing of the package.
"""
