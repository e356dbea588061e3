"""A third-party library's package, not an installed app (as `modelsearch` is to Wagtail)."""
