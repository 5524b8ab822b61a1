package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestLogFormat(t *testing.T) {
	for _, tc := range []struct {
		format string
		json   bool
	}{
		{"auto", true}, // a buffer is not a terminal
		{"json", true},
		{"text", false},
	} {
		t.Run(tc.format, func(t *testing.T) {
			var b bytes.Buffer
			newLogger(&b, tc.format, slog.LevelInfo).With("node", "n1").Info("hello", "partition", 3)
			var m map[string]any
			isJSON := json.Unmarshal(b.Bytes(), &m) == nil
			if isJSON != tc.json {
				t.Fatalf("%s: got %q", tc.format, b.String())
			}
			if !strings.Contains(b.String(), "n1") || !strings.Contains(b.String(), "partition") {
				t.Errorf("%s: attributes missing: %q", tc.format, b.String())
			}
		})
	}
	if err := checkLogFormat("yaml"); err == nil {
		t.Error("log-format yaml accepted")
	}
}
