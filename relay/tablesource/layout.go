package tablesource

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrInvalidLayout is wrapped by the error of Validate (and so of every
// function that takes a Layout) when the layout names no usable table or
// column.
var ErrInvalidLayout = errors.New("invalid table layout")

// ErrUnknownPreset is wrapped by the error of Preset for a name that is
// not a preset.
var ErrUnknownPreset = errors.New("unknown table layout")

// maxIdentifierBytes is PostgreSQL's NAMEDATALEN - 1: a longer name is
// truncated by the server without an error, and would then name another
// column than the one the operator wrote.
const maxIdentifierBytes = 63

// Layout maps a user's outbox table: the table's name and the names of the
// columns Ordo reads. Names are identifiers exactly as PostgreSQL stores
// them (case-sensitive, unquoted): "OutboxMessages", not outboxmessages.
// A Layout is a plain value, safe for concurrent use once built.
type Layout struct {
	// Schema holds the table; empty means the connection's search_path.
	Schema string
	// Table is the outbox table's name.
	Table string
	// ID is the message id: a uuid, unique in the table. It becomes the
	// AMQP message id and breaks ties in a key's order.
	ID string
	// Type is the message type (text), sent as the AMQP type.
	Type string
	// RoutingKey is the routing key (text) the message is published with.
	RoutingKey string
	// Payload is the message body (jsonb, json or text holding a JSON
	// object).
	Payload string
	// CorrelationID is the ordering key (text, nullable): rows with one
	// correlation id are published in order. A row where it is null is a
	// key of its own, keyed by its id.
	CorrelationID string
	// OccurredAt orders a key's rows (timestamptz), ties broken by ID.
	OccurredAt string
	// ProcessedAt is null while the row is pending and set once the broker
	// confirmed it (timestamptz, nullable).
	ProcessedAt string
}

// ArticleDDL creates the table Article maps, exactly as the article's EF
// Core model does (Npgsql): "Type" and "RoutingKey" HasMaxLength(200),
// and the filtered index on "OccurredAt" that the pending read walks.
const ArticleDDL = `
CREATE TABLE "OutboxMessages" (
    "Id" uuid NOT NULL,
    "Type" character varying(200) NOT NULL,
    "RoutingKey" character varying(200) NOT NULL,
    "Payload" jsonb NOT NULL,
    "CorrelationId" text NULL,
    "OccurredAt" timestamp with time zone NOT NULL,
    "ProcessedAt" timestamp with time zone NULL,
    CONSTRAINT "PK_OutboxMessages" PRIMARY KEY ("Id")
);
CREATE INDEX "IX_OutboxMessages_OccurredAt" ON "OutboxMessages" ("OccurredAt") WHERE "ProcessedAt" IS NULL;`

// Article returns the layout of the table the article's EF Core model
// creates: "OutboxMessages" with "Id", "Type", "RoutingKey", "Payload",
// "CorrelationId", "OccurredAt" and "ProcessedAt".
func Article() Layout {
	return Layout{
		Table:         "OutboxMessages",
		ID:            "Id",
		Type:          "Type",
		RoutingKey:    "RoutingKey",
		Payload:       "Payload",
		CorrelationID: "CorrelationId",
		OccurredAt:    "OccurredAt",
		ProcessedAt:   "ProcessedAt",
	}
}

// presets are the layouts Preset knows by name.
var presets = map[string]func() Layout{
	"article": Article,
}

// Preset returns the layout called name ("article"), or an error wrapping
// ErrUnknownPreset that lists the known names.
func Preset(name string) (Layout, error) {
	f, ok := presets[name]
	if !ok {
		return Layout{}, fmt.Errorf("%w %q (known: article)", ErrUnknownPreset, name)
	}
	return f(), nil
}

// specKey is a key of a layout spec (ParseLayout) and the field it sets.
type specKey struct {
	key string
	set func(*Layout) *string
}

// specKeys are the keys of a layout spec.
var specKeys = []specKey{
	{"schema", func(l *Layout) *string { return &l.Schema }},
	{"table", func(l *Layout) *string { return &l.Table }},
	{"id", func(l *Layout) *string { return &l.ID }},
	{"type", func(l *Layout) *string { return &l.Type }},
	{"routing_key", func(l *Layout) *string { return &l.RoutingKey }},
	{"payload", func(l *Layout) *string { return &l.Payload }},
	{"correlation_id", func(l *Layout) *string { return &l.CorrelationID }},
	{"occurred_at", func(l *Layout) *string { return &l.OccurredAt }},
	{"processed_at", func(l *Layout) *string { return &l.ProcessedAt }},
}

// ParseLayout returns the layout a spec describes: a preset's name
// ("article"), or items separated by ";": optionally a preset's name
// first, then key=name items that set the table and the columns, each
// at most once. The keys are schema, table, id, type, routing_key,
// payload, correlation_id, occurred_at and processed_at; without a
// preset every one but schema must be given. Names are taken as
// written (case-sensitive, no quotes), so
//
//	article;table=outbox_messages;correlation_id=AggregateId
//
// is the article's table renamed, with its key in "AggregateId". The
// result is validated (Layout.Validate); every problem is reported at
// once, in an error wrapping ErrInvalidLayout or ErrUnknownPreset.
func ParseLayout(spec string) (Layout, error) {
	items := strings.Split(spec, ";")
	var l Layout
	var problems []string
	first := strings.TrimSpace(items[0])
	if !strings.Contains(first, "=") {
		p, err := Preset(first)
		if err != nil {
			return Layout{}, err
		}
		l, items = p, items[1:]
	}
	set := map[string]bool{}
	for _, item := range items {
		key, name, ok := strings.Cut(strings.TrimSpace(item), "=")
		key = strings.TrimSpace(key)
		i := slices.IndexFunc(specKeys, func(k specKey) bool { return k.key == key })
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%q is not key=name (a preset's name goes first)", item))
		case i < 0:
			problems = append(problems, fmt.Sprintf("unknown key %q (known: %s)", key, specKeyNames()))
		case set[key]:
			problems = append(problems, fmt.Sprintf("%s is given twice", key))
		default:
			set[key] = true
			*specKeys[i].set(&l) = name
		}
	}
	if len(problems) > 0 {
		return Layout{}, fmt.Errorf("%w %q: %s", ErrInvalidLayout, spec, strings.Join(problems, "; "))
	}
	if err := l.Validate(); err != nil {
		return Layout{}, fmt.Errorf("layout %q: %w", spec, err)
	}
	return l, nil
}

// specKeyNames lists the keys of a layout spec.
func specKeyNames() string {
	names := make([]string, len(specKeys))
	for i, k := range specKeys {
		names[i] = k.key
	}
	return strings.Join(names, ", ")
}

// column is one mapped column: the field's name for errors, and its value.
type column struct {
	field string
	name  string
}

// columns lists the mapped columns in a fixed order.
func (l Layout) columns() []column {
	return []column{
		{"ID", l.ID},
		{"Type", l.Type},
		{"RoutingKey", l.RoutingKey},
		{"Payload", l.Payload},
		{"CorrelationID", l.CorrelationID},
		{"OccurredAt", l.OccurredAt},
		{"ProcessedAt", l.ProcessedAt},
	}
}

// Validate reports every problem of the layout at once, in an error
// wrapping ErrInvalidLayout: a missing table or column name, a name
// longer than PostgreSQL keeps (63 bytes) or holding a NUL byte, and a
// column mapped to two fields. It does not look at the database; Check
// does.
func (l Layout) Validate() error {
	var problems []string
	checkName := func(field, name string, required bool) {
		switch {
		case name == "" && required:
			problems = append(problems, field+" is empty")
		case len(name) > maxIdentifierBytes:
			problems = append(problems, fmt.Sprintf("%s %q is %d bytes, longer than PostgreSQL's %d", field, name, len(name), maxIdentifierBytes))
		case strings.ContainsRune(name, 0):
			problems = append(problems, fmt.Sprintf("%s %q holds a NUL byte", field, name))
		}
	}
	checkName("Schema", l.Schema, false)
	checkName("Table", l.Table, true)
	seen := map[string]string{}
	for _, c := range l.columns() {
		checkName(c.field, c.name, true)
		if c.name == "" {
			continue
		}
		if other, ok := seen[c.name]; ok {
			problems = append(problems, fmt.Sprintf("%s and %s both name column %q", other, c.field, c.name))
			continue
		}
		seen[c.name] = c.field
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidLayout, strings.Join(problems, "; "))
	}
	return nil
}

// QuotedTable returns the table's name quoted for SQL: "schema"."table",
// or "table" without a schema.
func (l Layout) QuotedTable() string {
	if l.Schema == "" {
		return pgx.Identifier{l.Table}.Sanitize()
	}
	return pgx.Identifier{l.Schema, l.Table}.Sanitize()
}

// quote quotes one column name for SQL.
func quote(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// String returns the table's name as written in SQL, for logs and errors.
func (l Layout) String() string {
	return l.QuotedTable()
}
