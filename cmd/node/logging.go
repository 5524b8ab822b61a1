package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

// checkLogFormat refuses a -log-format other than auto, json and text.
func checkLogFormat(f string) error {
	switch f {
	case "auto", "json", "text":
		return nil
	}
	return fmt.Errorf("log-format %q: want auto, json or text", f)
}

// newLogger returns the node's logger on w: JSON lines for log collectors,
// or text for a person at a terminal. format auto picks text when w is a
// terminal, JSON otherwise.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "text" || (format == "auto" && isTerminal(w)) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
