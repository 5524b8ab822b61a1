package confcheck_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

func fields(err error) []string {
	var fs []string
	for _, p := range confcheck.Problems(err) {
		fs = append(fs, p.Scope+" "+p.Field)
	}
	return fs
}

func TestChecker(t *testing.T) {
	inner := confcheck.New("inner")
	inner.Require(false, "A", "a is %d", 1)
	inner.Require(true, "B", "never")
	inner.Require(false, "C", "c")

	outer := confcheck.New("outer")
	outer.Require(false, "Top", "top")
	outer.Nest("In", inner.Err())
	outer.Nest("Other", errors.New("plain"))
	outer.Nest("None", nil)
	err := outer.Err()

	if got, want := fields(err), []string{"outer Top", "outer In.A", "outer In.C"}; !slices.Equal(got, want) {
		t.Fatalf("problems %v, want %v", got, want)
	}
	want := "outer: Top: top\nouter: In.A: a is 1\nouter: In.C: c\nouter: Other: plain"
	if err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
	if confcheck.New("x").Err() != nil || confcheck.Problems(nil) != nil {
		t.Fatal("no problem is not nil")
	}
}

// TestNestDerived: a problem of a derived field is reported at its source,
// once: left out when the source has a problem of its own (that one stands
// for it), recorded under the source's name when it has none, never
// dropped silently.
func TestNestDerived(t *testing.T) {
	inner := confcheck.New("inner")
	inner.Require(false, "Name", "is empty")
	inner.Require(false, "Timeout", "-1s is not positive")
	inner.Require(false, "Size", "0 is below 1")

	outer := confcheck.New("outer")
	outer.Require(false, "TTL", "-2s is negative")
	outer.Nest("In", inner.Err(), confcheck.From{Field: "Timeout", Source: "TTL"}, confcheck.From{Field: "Name", Source: "NodeName"})
	want := "outer: TTL: -2s is negative\nouter: NodeName: as In.Name: is empty\nouter: In.Size: 0 is below 1"
	if err := outer.Err(); err == nil || err.Error() != want {
		t.Fatalf("error\n%v\nwant\n%s", err, want)
	}
}
