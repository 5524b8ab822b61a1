-- m11 without the relay's three partial indexes that an insert only tests (parked, retention, dead)
DROP INDEX outbox_parked, outbox_retention, outbox_dead;
