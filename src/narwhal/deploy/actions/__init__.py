"""What each `narwhal` command does, as functions: the CLI (deploy/cli) parses flags into
their options and renders their results, and `narwhal deploy` calls the same functions."""
