"""Re-exports, as `wagtail.search.tasks` re-exports `modelsearch.tasks`' task."""

from tests.searchlib.tasks import index_page, slow_index, writes_then_fails

__all__ = ["index_page", "slow_index", "writes_then_fails"]
