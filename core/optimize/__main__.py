"""`python -m core.optimize`: see `core.optimize.cli`."""

import signal

from core.optimize.cli import main
from core.runtime.errors import exit_on_input_error

# Started in the background by a shell, a process inherits SIGINT ignored; a run is stopped with
# SIGINT all the same (`kill -INT`, a bench's sitting), and left resumable.
signal.signal(signal.SIGINT, signal.default_int_handler)
exit_on_input_error(main)
