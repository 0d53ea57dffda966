"""`python -m leap` runs the command line."""

from leap.cli import main

main()
