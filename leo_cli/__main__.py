"""`python -m leo_cli` is the `leo` command."""

from leo_cli.cli.app import main

main()
