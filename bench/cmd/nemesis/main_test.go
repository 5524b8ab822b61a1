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
	if cfg.Seed != 11 || cfg.Profile != nemesis.ProfileLong || len(cfg.Kinds) != 2 {
		t.Fatalf("parsed %+v", cfg)
	}
	for _, args := range [][]string{
		{"-profile", "medium"},
		{"-kinds", "kill,nap"},
		{"-confirm-window", "0"},
		{"stray"},
		{"-scenario", "consumers", "-kinds", "hostile-row"},
		{"-scenario", "producers"},
	} {
		if _, err := parseConfig(args, lookup, io.Discard); err == nil {
			t.Errorf("%q was accepted", args)
		}
	}
}
