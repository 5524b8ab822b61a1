package envflag

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	env := map[string]string{"ORDO_HTTP_ADDR": "from-env", "ORDO_CONFIRM_WINDOW": "7", "ORDO_POLL": "2s"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	addr := fs.String("http-addr", "def", "")
	w := fs.Int("confirm-window", 1, "")
	poll := fs.Duration("poll", time.Second, "")
	name := fs.String("node-name", "n", "")
	if err := Parse(fs, "ORDO", []string{"-confirm-window", "9"}, lookup); err != nil {
		t.Fatal(err)
	}
	if *addr != "from-env" || *w != 9 || *poll != 2*time.Second || *name != "n" {
		t.Fatalf("got addr=%q w=%d poll=%v name=%q", *addr, *w, *poll, *name)
	}
}

func TestParseBadEnv(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("confirm-window", 1, "")
	err := Parse(fs, "ORDO", nil, func(k string) (string, bool) { return "many", k == "ORDO_CONFIRM_WINDOW" })
	if err == nil || !strings.Contains(err.Error(), "ORDO_CONFIRM_WINDOW") {
		t.Fatalf("err = %v, want one naming ORDO_CONFIRM_WINDOW", err)
	}
}
