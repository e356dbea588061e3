"""What differs between the databases, in one place: the database's clock (clock.py), the
notifications PostgreSQL sends as writes commit (notify.py), SQLite's turns at its write
lock (sqlite_turns.py) and its driver taken directly (sqlite_direct.py), and
MariaDB/MySQL's forms of the model indexes (indexes.py)."""
