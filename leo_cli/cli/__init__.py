"""The `leo` command: one thin module per command (parse, load config, call one function,
render)."""
