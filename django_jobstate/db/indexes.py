"""Indexes that MariaDB/MySQL get in another form, and the check that they have it.

InnoDB has neither partial nor (on MariaDB) expression indexes: Django creates the
partial indexes of models.py there without their condition (whole indexes, which serve the
same queries), and neither the partial unique constraints nor the claim's expression
index. Migration 0009 creates those in MySQL's form (unique indexes over virtual columns,
under the same names, and the claim-order index). So Django's warnings that they are
ignored (models.W036, W037, W043) would only be noise on every `manage.py` command there:
these classes are Django's own save for check(), which leaves those warnings out on
MariaDB/MySQL, while checks/mysql.py (E017) verifies that migration 0009's indexes
exist. They deconstruct as, and compare equal to, Django's classes: the migrations, and
what they create on PostgreSQL and SQLite, are unchanged.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

# The warnings of Django's that migration 0009 answers on MariaDB/MySQL.
IGNORED_ON_MYSQL = {"models.W036", "models.W037", "models.W043"}


def _checked(messages: list[CheckMessage], connection: BaseDatabaseWrapper) -> list[CheckMessage]:
    if connection.vendor != "mysql":
        return messages
    return [m for m in messages if m.id not in IGNORED_ON_MYSQL]


class Index(models.Index):
    """models.Index, without Django's warnings about the MariaDB/MySQL form."""

    def check(self, model: Any, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
        return _checked(super().check(model, connection), connection)

    def deconstruct(self) -> Any:
        _, args, kwargs = super().deconstruct()
        return "django.db.models.Index", args, kwargs

    def __eq__(self, other: object) -> bool:  # the migrations' models.Index is the same
        if isinstance(other, models.Index):
            return bool(self.deconstruct() == other.deconstruct())
        return NotImplemented


class UniqueConstraint(models.UniqueConstraint):
    """models.UniqueConstraint, without Django's warnings about the MariaDB/MySQL form."""

    def check(self, model: Any, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
        return _checked(super().check(model, connection), connection)

    def deconstruct(self) -> Any:
        _, args, kwargs = super().deconstruct()
        return "django.db.models.UniqueConstraint", args, kwargs

    def __eq__(self, other: object) -> bool:  # the migrations' UniqueConstraint is the same
        if isinstance(other, models.UniqueConstraint):
            return bool(self.deconstruct() == other.deconstruct())
        return NotImplemented
