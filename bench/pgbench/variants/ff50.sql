-- the outbox's pages filled by inserts to half, so that the mark's new row
-- version fits on its row's page (the mark's WAL is then the changed bytes
-- only, not the whole row): what that costs the producers
ALTER TABLE outbox SET (fillfactor = 50);
