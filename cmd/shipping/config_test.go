package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/inbox"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c config)
		wantErr string
	}{
		{name: "defaults", check: func(t *testing.T, c config) {
			if c.inbox.Name != "shipping" || c.inbox.Exchange != "bookstore.ordering" || c.inbox.Shards != 8 ||
				c.dbMaxConns != 34 || c.inbox.Mode != inbox.Ordered || len(c.command) != 0 {
				t.Fatalf("defaults: %+v", c)
			}
		}},
		{name: "environment", env: map[string]string{"ORDO_SHARDS": "4", "ORDO_MODE": "partial", "ORDO_LEASE_TTL": "2s"},
			check: func(t *testing.T, c config) {
				if c.inbox.Shards != 4 || c.inbox.Mode != inbox.Partial || c.inbox.LeaseTTL != 2*time.Second || c.dbMaxConns != 18 {
					t.Fatalf("from the environment: %+v", c)
				}
			}},
		{name: "lanes size the pool", args: []string{"-shards", "6", "-lanes", "2"}, check: func(t *testing.T, c config) {
			if c.inbox.Lanes != 2 || c.dbMaxConns != 14 {
				t.Fatalf("lanes 2 of 6 shards: %+v", c)
			}
		}},
		{name: "group commit", args: []string{"-batch", "4", "-batch-time", "5ms"}, check: func(t *testing.T, c config) {
			if c.inbox.BatchSize != 4 || c.inbox.BatchTime != 5*time.Millisecond {
				t.Fatalf("-batch 4 -batch-time 5ms: %+v", c)
			}
		}},
		{name: "bad batch", args: []string{"-batch", "33"}, wantErr: "BatchSize"},
		{name: "subcommand", args: []string{"-shards", "12", "reshard"}, check: func(t *testing.T, c config) {
			if c.inbox.Shards != 12 || len(c.command) != 1 || c.command[0] != "reshard" {
				t.Fatalf("subcommand: %+v", c)
			}
		}},
		{name: "bad mode", args: []string{"-mode", "strict"}, wantErr: "mode"},
		{name: "bad shards", args: []string{"-shards", "0"}, wantErr: "Shards"},
		{name: "bad pool", args: []string{"-db-max-conns", "1"}, wantErr: "db-max-conns"},
		{name: "help", args: []string{"-h"}, wantErr: flag.ErrHelp.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseConfig(tc.args, lookup, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}
