// Package confcheck collects the problems of a configuration, each naming
// the field it is about, so that a Validate method reports every problem
// at once (errors.Join) and a command line can say which flag to fix.
//
//	func (c Config) Validate() error {
//		ck := confcheck.New("relay")
//		ck.Require(c.Window >= 1, "Window", "%d is below 1", c.Window)
//		return ck.Err()
//	}
//
// A configuration that nests another re-roots its problems with Nest:
// "Window" of the relay's config becomes "Relay.Window" of the node's, and
// a field the enclosing configuration derives from one of its own (From)
// is reported at that source.
package confcheck

import (
	"errors"
	"fmt"
)

// Problem is one unusable setting.
type Problem struct {
	// Scope names the configuration, e.g. "relay" or "node".
	Scope string
	// Field is the Go field path within it, e.g. "Window" or
	// "Relay.Window".
	Field string
	// Msg says what is wrong, without the field's name.
	Msg string
}

func (p *Problem) Error() string { return p.Scope + ": " + p.Field + ": " + p.Msg }

// Checker collects the problems of one configuration. The zero value is
// not usable; create one with New. Not safe for concurrent use.
type Checker struct {
	scope string
	errs  []error
}

// New returns a Checker for the configuration named scope.
func New(scope string) *Checker { return &Checker{scope: scope} }

// Require records a problem with field when ok is false.
func (c *Checker) Require(ok bool, field, format string, args ...any) {
	if !ok {
		c.errs = append(c.errs, &Problem{Scope: c.scope, Field: field, Msg: fmt.Sprintf(format, args...)})
	}
}

// From says that a nested configuration's field is not set by the user
// but derived by the enclosing configuration from one of its own fields:
// Field is the nested field ("ReadTimeout"), Source the enclosing field
// it is computed from ("LeaseTTL", "Relay.Window").
type From struct {
	Field, Source string
}

// Nest records the problems of a nested configuration's error under
// prefix (the field holding it): "Window" becomes prefix+".Window".
//
// A problem with a field the enclosing configuration derives (listed in
// derived) is a problem of its source, and is reported there, once: it is
// left out when the source already has a problem (check the sources
// first: the derived value is only as good as its source), and recorded
// under the source's name otherwise, saying what it became. Nothing a
// nested configuration reports is dropped unless its source's problem
// stands for it.
//
// An error that is not a Problem is kept, wrapped with prefix.
func (c *Checker) Nest(prefix string, err error, derived ...From) {
	for _, e := range flatten(err) {
		var p *Problem
		if !errors.As(e, &p) {
			c.errs = append(c.errs, fmt.Errorf("%s: %s: %w", c.scope, prefix, e))
			continue
		}
		field, msg := prefix+"."+p.Field, p.Msg
		for _, d := range derived {
			if d.Field == p.Field {
				field, msg = d.Source, "as "+prefix+"."+p.Field+": "+p.Msg
			}
		}
		if field == prefix+"."+p.Field || !c.has(field) {
			c.errs = append(c.errs, &Problem{Scope: c.scope, Field: field, Msg: msg})
		}
	}
}

// has reports whether a problem with field was recorded.
func (c *Checker) has(field string) bool {
	for _, p := range Problems(errors.Join(c.errs...)) {
		if p.Field == field {
			return true
		}
	}
	return false
}

// Err returns every problem recorded, joined, or nil.
func (c *Checker) Err() error { return errors.Join(c.errs...) }

// Problems returns the problems err holds, in order: err itself, or the
// errors it joins (recursively). Errors that are not Problems are left
// out.
func Problems(err error) []*Problem {
	var ps []*Problem
	for _, e := range flatten(err) {
		var p *Problem
		if errors.As(e, &p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// Fields returns the Field of every problem err holds, in order.
func Fields(err error) []string {
	var fs []string
	for _, p := range Problems(err) {
		fs = append(fs, p.Field)
	}
	return fs
}

// flatten returns the errors err joins, recursively, or err alone.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var all []error
	for _, e := range j.Unwrap() {
		all = append(all, flatten(e)...)
	}
	return all
}

// Fill sets *p to d when *p is the zero value: how a constructor fills the
// fields its caller left unset from the package's DefaultConfig.
func Fill[T comparable](p *T, d T) {
	var zero T
	if *p == zero {
		*p = d
	}
}
