// Package tablesource reads an outbox table that Ordo did not create: a
// team's own table, such as the one the article's EF Core model creates
// ("OutboxMessages"), relayed as it is, with no trigger and no column added.
//
// A Layout names the table and the columns that hold a message's id, type,
// routing key, payload, correlation id, time of occurrence and time of
// processing. Article returns the article's layout; a team whose table
// differs builds its own and checks it with Validate, then with Check
// against the database. Identifiers are always quoted (pgx.Identifier), so
// any name PostgreSQL accepts is safe to map, and a name it would silently
// truncate is refused.
//
// Reader.Pending reads the table's pending rows (processed-at null) in each
// key's order, occurred-at then id, and resolves each row's key (the
// correlation id, or the id where it is null) and its partition, computed
// here with partition.Of: PostgreSQL has no xxhash, and the user's table
// has no partition column. A row that cannot be published as it is (a
// payload that is not a JSON object, a key longer than an AMQP short
// string) is returned with its Problem set, never dropped and never an
// error for the whole read.
//
// Reader.DryRun reports, from one snapshot, what a relay would publish
// (counts, keys, partitions, the oldest pending age, the bad rows, sampled
// keys' order) before a cut-over.
//
// The Reader only reads: it takes no lock, writes nothing and may run
// beside the table's existing relay.
//
// Relaying the table takes Ordo's own tables beside it (Migrate:
// ordo_table_rows, ordo_table_keys, the numbering function; nothing is
// added to the user's table). Intake, run by the holder of partition 0,
// takes the pending rows into ordo_table_rows, idempotently; Store, a
// relay.Store, has each partition's owner number its rows under its lease
// (durable before the first publish), reads key heads with the message
// from the user's row by primary key, and marks a published row by
// setting the user's processed-at and forgetting it, in one statement
// fenced by the lease. docs/adopt.md is the design.
package tablesource
