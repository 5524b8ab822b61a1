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
	inner.Require(false, "Derived", "set by the outer config")
	inner.Require(false, "C", "c")

	outer := confcheck.New("outer")
	outer.Require(false, "Top", "top")
	outer.Nest("In", inner.Err(), "Derived")
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
