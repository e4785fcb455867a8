"""Command-line entry points (`quartet ...`); each subcommand lives in its own module."""
