"""`python -m store`: see `store.cli`."""

from core.runtime.errors import exit_on_input_error
from store.cli import main

if __name__ == "__main__":
    exit_on_input_error(main)
