"""A third-party installed app whose `tasks` module re-exports a library's tasks."""
