"""``python -m sluice``: the same as the ``sluice`` command."""
from sluice.cli import main

if __name__ == "__main__":
    main()
