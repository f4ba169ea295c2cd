"""`python -m core.evaluate`: see `core.evaluate.cli`."""

import sys

from core.evaluate.cli import main
from core.runtime.errors import exit_on_input_error

exit_on_input_error(lambda: main(sys.argv[1:]))
