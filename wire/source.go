package wire

import (
	"errors"
	"fmt"
)

// DefaultSource is the name of the source a node's -postgres-url gives
// (the one-source form), and the source of every message without
// HeaderSource. It is reserved for that database: it is the one whose
// keys existed before sources did, so renaming it would make consumers
// see its keys as new ones (see docs/design.md, "Sources").
const DefaultSource = "default"

// MaxSourceLen is the longest source name, in bytes.
const MaxSourceLen = 32

// ErrInvalidSource is returned (wrapped) by ValidateSource and Source
// when a source name breaks the rule of ValidateSource.
var ErrInvalidSource = errors.New("invalid source name")

// ErrNotString is returned (wrapped) by Source when HeaderSource holds
// another type than a string (or AMQP byte array).
var ErrNotString = errors.New("header not a string")

// ValidateSource checks a source name: 1 to MaxSourceLen bytes, the first
// a lowercase ASCII letter (a-z), the others lowercase ASCII letters,
// digits (0-9), '_' or '-'. Such a name needs no quoting in a flag
// (NAME=URL), in ORDO_SOURCES (space-separated), in a URL query, a
// Prometheus label or a log line, and cannot be confused with another
// name by case. It returns an error wrapping ErrInvalidSource otherwise.
func ValidateSource(name string) error {
	if name == "" || len(name) > MaxSourceLen {
		return fmt.Errorf("source %q: %d bytes, want 1 to %d: %w", name, len(name), MaxSourceLen, ErrInvalidSource)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z':
		case i > 0 && ('0' <= c && c <= '9' || c == '_' || c == '-'):
		default:
			return fmt.Errorf("source %q: byte %d (%q) not allowed: want [a-z][a-z0-9_-]*: %w", name, i, c, ErrInvalidSource)
		}
	}
	return nil
}

// Source returns the source a message with headers h belongs to: the
// value of HeaderSource, or DefaultSource when the header is absent. A
// string and a byte array (which some clients send for a string) are
// accepted; another type returns an error wrapping ErrNotString, a name
// that ValidateSource refuses one wrapping ErrInvalidSource.
func Source(h map[string]any) (string, error) {
	v, ok := h[HeaderSource]
	if !ok {
		return DefaultSource, nil
	}
	var name string
	switch x := v.(type) {
	case string:
		name = x
	case []byte:
		name = string(x)
	default:
		return "", fmt.Errorf("%s is a %T: %w", HeaderSource, v, ErrNotString)
	}
	if err := ValidateSource(name); err != nil {
		return "", fmt.Errorf("%s: %w", HeaderSource, err)
	}
	return name, nil
}
