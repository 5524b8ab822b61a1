package main

import (
	"io"
	"testing"

	"github.com/ordo-relay/ordo/bench/nemesis"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{"ORDO_NEMESIS_SEED": "11"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := parseConfig([]string{"-profile", "long", "-kinds", "kill,pause"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Seed != 11 || cfg.Profile != nemesis.ProfileLong || len(cfg.Kinds) != 2 || cfg.Sources != 0 {
		t.Fatalf("parsed %+v", cfg)
	}
	if cfg, err := parseConfig([]string{"-sources", "1"}, lookup, io.Discard); err != nil || cfg.Sources != 1 {
		t.Fatalf("-sources 1: %+v, %v", cfg, err)
	}
	if cfg.Lean {
		t.Fatal("lean by default")
	}
	if cfg, err := parseConfig([]string{"-lean"}, lookup, io.Discard); err != nil || !cfg.Lean {
		t.Fatalf("-lean: %+v, %v", cfg, err)
	}
	env["ORDO_NEMESIS_LEAN"] = "true"
	if cfg, err := parseConfig(nil, lookup, io.Discard); err != nil || !cfg.Lean {
		t.Fatalf("ORDO_NEMESIS_LEAN=true: %+v, %v", cfg, err)
	}
	delete(env, "ORDO_NEMESIS_LEAN")
	for _, args := range [][]string{
		{"-profile", "medium"},
		{"-kinds", "kill,nap"},
		{"-confirm-window", "0"},
		{"stray"},
		{"-scenario", "consumers", "-kinds", "hostile-row"},
		{"-scenario", "producers"},
		{"-sources", "3"},
		{"-sources", "1", "-kinds", "source-link"},
		{"-scenario", "consumers", "-sources", "2"},
		{"-scenario", "consumers", "-lean"},
	} {
		if _, err := parseConfig(args, lookup, io.Discard); err == nil {
			t.Errorf("%q was accepted", args)
		}
	}
}
