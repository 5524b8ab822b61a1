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

func TestNewReaderPartitions(t *testing.T) {
	for _, n := range []int{0, -1, 4097} {
		if _, err := tablesource.NewReader(tablesource.Article(), n); err == nil {
			t.Errorf("NewReader(article, %d): nil error, want the count refused", n)
		}
	}
}
