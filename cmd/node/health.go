package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
)

// healthMain is "node health": it asks an HTTP address for a health path
// and exits 0 on 200, 1 otherwise. It is the container healthcheck of
// docker-compose.yml, whose image has no shell or curl.
func healthMain(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http", "127.0.0.1:8081", "the HTTP address (host:port or URL)")
	path := fs.String("path", "/readyz", "the path to ask")
	fs.Usage = envflag.Usage(fs, "ORDO_HEALTH", "usage: node health [-http ADDR] [-path /readyz]\n\nExits 0 when the path answers 200.")
	if err := envflag.Parse(fs, "ORDO_HEALTH", args, lookup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(nodeURL(*addr, *path))
	if err != nil {
		fmt.Fprintln(stderr, "node health:", err)
		return 1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(stdout, "%s %s\n", resp.Status, strings.TrimSpace(string(b)))
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}
