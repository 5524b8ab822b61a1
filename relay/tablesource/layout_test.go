package tablesource_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/relay/tablesource"
)

func TestLayoutValidate(t *testing.T) {
	long := strings.Repeat("x", 64)
	tests := []struct {
		name string
		edit func(*tablesource.Layout)
		want []string // substrings of the error; none means valid
	}{
		{name: "article", edit: func(*tablesource.Layout) {}},
		{name: "schema and odd names", edit: func(l *tablesource.Layout) {
			l.Schema, l.Table, l.ID = "app", `Out"box; DROP TABLE x`, "Id Column"
		}},
		{name: "empty table", edit: func(l *tablesource.Layout) { l.Table = "" }, want: []string{"Table is empty"}},
		{name: "empty column", edit: func(l *tablesource.Layout) { l.ProcessedAt = "" }, want: []string{"ProcessedAt is empty"}},
		{name: "truncated name", edit: func(l *tablesource.Layout) { l.Payload = long },
			want: []string{"Payload", "64 bytes, longer than PostgreSQL's 63"}},
		{name: "NUL byte", edit: func(l *tablesource.Layout) { l.Schema = "a\x00b" }, want: []string{"Schema", "NUL byte"}},
		{name: "column twice", edit: func(l *tablesource.Layout) { l.OccurredAt = "Id" },
			want: []string{`ID and OccurredAt both name column "Id"`}},
		{name: "every problem at once", edit: func(l *tablesource.Layout) { l.Table, l.Type, l.RoutingKey = "", "", long },
			want: []string{"Table is empty", "Type is empty", "RoutingKey"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tablesource.Article()
			tt.edit(&l)
			err := l.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tablesource.ErrInvalidLayout) {
				t.Fatalf("Validate: %v, want an error wrapping ErrInvalidLayout", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %q does not say %q", err, w)
				}
			}
			if _, rerr := tablesource.NewReader(l, 8); !errors.Is(rerr, tablesource.ErrInvalidLayout) {
				t.Errorf("NewReader: %v, want the layout refused", rerr)
			}
		})
	}
}

func TestQuotedTable(t *testing.T) {
	l := tablesource.Article()
	if got, want := l.QuotedTable(), `"OutboxMessages"`; got != want {
		t.Errorf("QuotedTable = %s, want %s", got, want)
	}
	l.Schema, l.Table = "app", `we"ird`
	if got, want := l.QuotedTable(), `"app"."we""ird"`; got != want {
		t.Errorf("QuotedTable = %s, want %s", got, want)
	}
}

func TestPreset(t *testing.T) {
	l, err := tablesource.Preset("article")
	if err != nil || l != tablesource.Article() {
		t.Fatalf("Preset(article) = %+v, %v; want Article()", l, err)
	}
	if _, err := tablesource.Preset("Article "); !errors.Is(err, tablesource.ErrUnknownPreset) || !strings.Contains(err.Error(), "known: article") {
		t.Fatalf("Preset(unknown): %v, want ErrUnknownPreset listing the known names", err)
	}
}

// TestParseLayout: a spec is a preset, a preset with overrides, or every
// column given; every problem of a bad one is named at once.
func TestParseLayout(t *testing.T) {
	renamed := tablesource.Article()
	renamed.Schema, renamed.Table, renamed.CorrelationID = "app", "outbox_messages", "AggregateId"
	full := tablesource.Layout{Table: "outbox", ID: "message_id", Type: "kind", RoutingKey: "topic", Payload: "body",
		CorrelationID: "aggregate_id", OccurredAt: "created_at", ProcessedAt: "sent_at"}
	for _, c := range []struct {
		spec string
		want tablesource.Layout
		errs []string // substrings of the error; nil: no error
	}{
		{"article", tablesource.Article(), nil},
		{" article ; schema=app; table=outbox_messages ;correlation_id=AggregateId", renamed, nil},
		{"table=outbox;id=message_id;type=kind;routing_key=topic;payload=body;correlation_id=aggregate_id;" +
			"occurred_at=created_at;processed_at=sent_at", full, nil},
		{"table=outbox;id=message_id", tablesource.Layout{}, []string{"Type is empty", "ProcessedAt is empty"}},
		{"article;colour=red;table=a;table=b;oops", tablesource.Layout{},
			[]string{`unknown key "colour" (known: schema, table, id,`, "table is given twice", `"oops" is not key=name`}},
		{"article;id=Type", tablesource.Layout{}, []string{`both name column "Type"`}},
		{"article;table=", tablesource.Layout{}, []string{"Table is empty"}},
		{"artikel;table=x", tablesource.Layout{}, []string{"known: article"}},
	} {
		l, err := tablesource.ParseLayout(c.spec)
		if c.errs == nil {
			if err != nil || l != c.want {
				t.Errorf("ParseLayout(%q) = %+v, %v; want %+v", c.spec, l, err, c.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseLayout(%q) = %+v, want an error", c.spec, l)
			continue
		}
		if !errors.Is(err, tablesource.ErrInvalidLayout) && !errors.Is(err, tablesource.ErrUnknownPreset) {
			t.Errorf("ParseLayout(%q): %v wraps neither ErrInvalidLayout nor ErrUnknownPreset", c.spec, err)
		}
		for _, want := range c.errs {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ParseLayout(%q): %v, want it to say %q", c.spec, err, want)
			}
		}
	}
}

func TestNewReaderPartitions(t *testing.T) {
	for _, n := range []int{0, -1, 4097} {
		if _, err := tablesource.NewReader(tablesource.Article(), n); err == nil {
			t.Errorf("NewReader(article, %d): nil error, want the count refused", n)
		}
	}
}
