"""`python -m core.optimize`: see `core.optimize.cli`."""

from core.optimize.cli import main
from core.runtime.errors import exit_on_input_error

exit_on_input_error(main)
