package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
)

// healthCmd is "node health": it asks an HTTP address for a health path
// and succeeds on 200 (exit status 0), fails otherwise (1). It is the
// container healthcheck of docker-compose.yml, whose image has no shell or
// curl.
func healthCmd(ctx context.Context, c cli, _ string, args []string) error {
	fs := flag.NewFlagSet("node health", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	addr := fs.String("http", "127.0.0.1:8081", "the HTTP address (host:port or URL)")
	path := fs.String("path", "/readyz", "the path to ask")
	fs.Usage = envflag.Usage(fs, "ORDO_HEALTH", "usage: node health [-http ADDR] [-path /readyz]\n\nExits 0 when the path answers 200.")
	if err := envflag.Parse(fs, "ORDO_HEALTH", args, c.lookup); err != nil {
		return usageError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodeURL(*addr, *path), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(c.stdout, "%s %s\n", resp.Status, strings.TrimSpace(string(b)))
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}
