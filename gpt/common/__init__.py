"""What every wing shares: the error a user can cause (``UserError``, one line), files written whole, and calls
bounded in time.

Owns: ``errors`` (UserError, first_line, os_reason, quoted), ``files`` (every file written whole or not at
all: ``replacing``, ``replacing_folder``, ``WriteError``; JSON records read back within a bound), ``bounded``
(``within``: a call given up on after a deadline; ``leave``: an exit that does not wait for it), ``stops``
(``StopNow``, ``LostPeer``: a run ended at once, said in one line by the commands).
May import: nothing of the package.
"""
