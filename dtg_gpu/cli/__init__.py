"""The `dtg` command line: thin sub-commands over the library."""
