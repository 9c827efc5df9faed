"""The front doors: one module per command, each ``main(argv=None) -> int``, kept thin (parse, check,
call the machinery). ``cli`` is what they share (the one-line error boundary, config arguments,
the hooks a training run gets).

May import: every wing; a command never imports another command (only ``cli``).
"""
