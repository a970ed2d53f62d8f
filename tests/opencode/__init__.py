"""End-to-end tests against the real `opencode` binary (a package, so its module names are its own)."""
