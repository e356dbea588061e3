"""Re-exports, as `wagtail.search.tasks` re-exports `modelsearch.tasks`' task."""

from tests.searchlib.tasks import index_page, slow_index

__all__ = ["index_page", "slow_index"]
