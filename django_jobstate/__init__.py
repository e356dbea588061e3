"""Background jobs for Django's Tasks framework, stored in your database."""
