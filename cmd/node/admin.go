package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/envflag"
)

// adminUsage is the synopsis of each admin subcommand.
var adminUsage = map[string]string{
	"parked": "usage: node parked [flags]\n\nLists parked messages with their error and what waits behind each.",
	"retry":  "usage: node retry [flags] MESSAGE-ID\n       node retry [flags] -key CORRELATION-ID\n       node retry [flags] [-error SUBSTRING] [-key-prefix PREFIX]\n\nPuts parked messages back at the head of their key.",
	"skip":   "usage: node skip [flags] MESSAGE-ID\n\nMarks a parked message dead: it is never published and its key goes on.",
	"purge":  "usage: node purge [flags]\n\nDeletes dead rows no longer needed to compute x-ordo-prev-key-seq.",
	"fill-gap": "usage: node fill-gap [flags] CORRELATION-ID KEY-SEQ\n\nPuts a dead placeholder row in a key_seq gap (listed by node parked),\n" +
		"so that the key's next message's x-ordo-prev-key-seq steps over it.",
	"gossip-key": "usage: node gossip-key [flags] add|use|remove BASE64-KEY\n\nOne step of a gossip key rotation on one running node.\n" +
		"Rotate a cluster by doing each step on every node before the next: add the new key, use it, remove the old one.",
}

// adminArgs is the parsed command line of an admin subcommand.
type adminArgs struct {
	addr, token, operator string
	source                string   // the source whose messages (empty: default)
	key, errSub, prefix   string   // retry's selectors
	args                  []string // positional arguments
}

// adminCmd runs an operator subcommand against a node's /admin
// endpoints. Bad usage is a usageError (exit status 2); a refusal or a
// failure is a plain error (1).
func adminCmd(ctx context.Context, c cli, cmd string, args []string) error {
	a, err := parseAdminArgs(c, cmd, args)
	if err != nil {
		return usageError(err)
	}
	method, path, body, err := a.request(cmd)
	if err != nil {
		return usageError(err)
	}
	answer, err := a.call(ctx, method, path, body)
	if err != nil {
		return err
	}
	if cmd != "parked" {
		fmt.Fprintln(c.stdout, strings.TrimSpace(string(answer)))
		return nil
	}
	var list []admin.Parked
	if err := json.Unmarshal(answer, &list); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	printParked(c.stdout, list)
	if answer, err = a.call(ctx, http.MethodGet, "/admin/gaps", nil); err != nil {
		return err
	}
	var gaps []admin.Gap
	if err := json.Unmarshal(answer, &gaps); err != nil {
		return fmt.Errorf("decode gaps: %w", err)
	}
	printGaps(c.stdout, gaps)
	return nil
}

// parseAdminArgs parses the flags of admin subcommand cmd.
func parseAdminArgs(c cli, cmd string, args []string) (adminArgs, error) {
	var a adminArgs
	fs := flag.NewFlagSet("node "+cmd, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(&a.addr, "http", "127.0.0.1:8081", "the node's HTTP address (host:port or URL)")
	fs.StringVar(&a.token, "admin-token", "", "the node's admin bearer token")
	fs.StringVar(&a.operator, "operator", currentUser(), "your name, recorded with the action")
	if cmd != "gossip-key" {
		fs.StringVar(&a.source, "source", "", "the source (outbox database) whose messages to act on; empty: default, the one-source form's")
	}
	fs.StringVar(&a.key, "key", "", "retry: the correlation id whose parked message to retry (instead of an id)")
	fs.StringVar(&a.errSub, "error", "", "retry: every parked message whose last error contains this (bulk)")
	fs.StringVar(&a.prefix, "key-prefix", "", "retry: every parked message whose correlation id starts with this (bulk; with -error, both must match)")
	// ORDO_ADMIN_TOKEN is the node's own variable; the CLI reads it too.
	fs.Usage = envflag.Usage(fs, envPrefix, adminUsage[cmd])
	err := envflag.Parse(fs, envPrefix, args, c.lookup)
	a.args = fs.Args()
	return a, err
}

// request returns the HTTP request that cmd makes, or why the arguments
// do not make one.
func (a adminArgs) request(cmd string) (method, path string, body io.Reader, err error) {
	nargs := len(a.args)
	arg := func(i int) string { return url.PathEscape(a.args[i]) }
	switch cmd {
	case "gossip-key":
		if nargs != 2 {
			return "", "", nil, errors.New("want an action (add, use or remove) and a base64 key")
		}
		b, _ := json.Marshal(map[string]string{"action": a.args[0], "key": a.args[1]})
		return http.MethodPost, "/admin/gossip-key", bytes.NewReader(b), nil
	case "fill-gap":
		if nargs != 2 {
			return "", "", nil, errors.New("want a correlation id and a key_seq")
		}
		return http.MethodPost, "/admin/keys/" + arg(0) + "/gaps/" + arg(1) + "/fill", nil, nil
	case "retry", "skip":
		return a.retryOrSkip(cmd)
	}
	if nargs > 0 {
		return "", "", nil, fmt.Errorf("unexpected arguments %q", a.args)
	}
	if cmd == "parked" {
		return http.MethodGet, "/admin/parked", nil, nil
	}
	return http.MethodPost, "/admin/purge", nil, nil
}

// retryOrSkip returns the request of "retry" or "skip": one message by
// id, or (retry only) one key, or every parked message matching a filter.
func (a adminArgs) retryOrSkip(cmd string) (method, path string, body io.Reader, err error) {
	bulk := a.errSub != "" || a.prefix != ""
	switch {
	case cmd == "retry" && bulk && a.key == "" && len(a.args) == 0:
		b, _ := json.Marshal(admin.Filter{ErrorContains: a.errSub, KeyPrefix: a.prefix})
		return http.MethodPost, "/admin/retry", bytes.NewReader(b), nil
	case cmd == "retry" && a.key != "" && len(a.args) == 0 && !bulk:
		return http.MethodPost, "/admin/keys/" + url.PathEscape(a.key) + "/retry", nil, nil
	case len(a.args) == 1 && a.key == "" && !bulk:
		return http.MethodPost, "/admin/messages/" + url.PathEscape(a.args[0]) + "/" + cmd, nil, nil
	case cmd == "retry":
		return "", "", nil, errors.New("give exactly one message id, or -key, or -error and/or -key-prefix")
	}
	return "", "", nil, errors.New("give exactly one message id")
}

// call sends one request to the node and returns the body of its 200
// answer; any other answer is an error carrying the node's message.
func (a adminArgs) call(ctx context.Context, method, path string, body io.Reader) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if a.source != "" {
		path += "?source=" + url.QueryEscape(a.source)
	}
	req, err := http.NewRequestWithContext(ctx, method, nodeURL(a.addr, path), body)
	if err != nil {
		return nil, usageError(err) // -http does not make a URL
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	req.Header.Set(admin.OperatorHeader, a.operator)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(answer, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(answer))
		}
		return nil, fmt.Errorf("%s (%s)", e.Error, resp.Status)
	}
	return answer, nil
}

// printParked prints parked messages as a table.
func printParked(w io.Writer, list []admin.Parked) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no parked messages")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tKEY_SEQ\tATTEMPTS\tWAITING\tPARKED\tERROR")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", p.ID, p.CorrelationID, p.KeySeq, p.Attempts, p.Waiting,
			p.ParkedAt.Format(time.RFC3339), p.LastError)
	}
	tw.Flush()
}

// printGaps prints key_seq gaps as a table, with what to do about them.
func printGaps(w io.Writer, gaps []admin.Gap) {
	if len(gaps) == 0 {
		fmt.Fprintln(w, "no key_seq gaps")
		return
	}
	fmt.Fprintf(w, "\n%d key_seq gap(s): no row holds these key_seqs, so consumers of the key will wait for them.\n"+
		"Fill one with: node fill-gap KEY KEY_SEQ (a dead placeholder the next message steps over)\n", len(gaps))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tKEY_SEQ\tPARTITION\tNEXT_ROW")
	for _, g := range gaps {
		next := "none yet"
		if g.NextKeySeq > 0 {
			next = fmt.Sprint(g.NextKeySeq)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", g.CorrelationID, g.KeySeq, g.Partition, next)
	}
	tw.Flush()
}

func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "unknown"
}
