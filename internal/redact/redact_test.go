package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://postgres@127.0.0.1:5432/db?sslmode=disable", "postgres://postgres@127.0.0.1:5432/db?sslmode=disable"},
		{"amqp://u:50%off-SECRET@127.0.0.1:5672/", "amqp://u:xxxxx@127.0.0.1:5672/"},
		{"amqp://u:p@ss#SECRET@h:1/", "amqp://u:xxxxx@h:1/"},
		{"amqp://u:SECRET@h:notaport/", "amqp://u:xxxxx@h:notaport/"},
		{"SECRET%zz", Mask},
		{"amqp://h:%zz/", "amqp://h:%zz/"},
		{"amqp://u@h:1/", "amqp://u@h:1/"},
		{"amqps://u:a:b/SECRET@h:1/vhost", "amqps://u:xxxxx@h:1/vhost"},
	} {
		got := URL(tc.in)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "SECRET") {
			t.Errorf("URL(%q) = %q keeps the secret", tc.in, got)
		}
	}
}
