package main

import (
	"bytes"
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

// adminMain runs an operator subcommand against a node's /admin endpoints
// and returns the exit code: 0 done, 1 refused or failed, 2 bad usage.
func adminMain(cmd string, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http", "127.0.0.1:8081", "the node's HTTP address (host:port or URL)")
	token := fs.String("admin-token", "", "the node's admin bearer token")
	op := fs.String("operator", currentUser(), "your name, recorded with the action")
	key := fs.String("key", "", "retry: the correlation id whose parked message to retry (instead of an id)")
	errSub := fs.String("error", "", "retry: every parked message whose last error contains this (bulk)")
	prefix := fs.String("key-prefix", "", "retry: every parked message whose correlation id starts with this (bulk; with -error, both must match)")
	usage := map[string]string{
		"parked": "usage: node parked [flags]\n\nLists parked messages with their error and what waits behind each.",
		"retry":  "usage: node retry [flags] MESSAGE-ID\n       node retry [flags] -key CORRELATION-ID\n       node retry [flags] [-error SUBSTRING] [-key-prefix PREFIX]\n\nPuts parked messages back at the head of their key.",
		"skip":   "usage: node skip [flags] MESSAGE-ID\n\nMarks a parked message dead: it is never published and its key goes on.",
		"purge":  "usage: node purge [flags]\n\nDeletes dead rows no longer needed to compute x-ordo-prev-key-seq.",
		"fill-gap": "usage: node fill-gap [flags] CORRELATION-ID KEY-SEQ\n\nPuts a dead placeholder row in a key_seq gap (listed by node parked),\n" +
			"so that the key's next message's x-ordo-prev-key-seq steps over it.",
		"gossip-key": "usage: node gossip-key [flags] add|use|remove BASE64-KEY\n\nOne step of a gossip key rotation on one running node.\n" +
			"Rotate a cluster by doing each step on every node before the next: add the new key, use it, remove the old one.",
	}[cmd]
	// ORDO_ADMIN_TOKEN is the node's own variable; the CLI reads it too.
	fs.Usage = envflag.Usage(fs, "ORDO", usage)
	if err := envflag.Parse(fs, "ORDO", args, lookup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var method, path string
	var body io.Reader
	switch cmd {
	case "gossip-key":
		if fs.NArg() != 2 {
			fmt.Fprintf(stderr, "node gossip-key: want an action (add, use or remove) and a base64 key\n")
			return 2
		}
		b, _ := json.Marshal(map[string]string{"action": fs.Arg(0), "key": fs.Arg(1)})
		method, path, body = http.MethodPost, "/admin/gossip-key", bytes.NewReader(b)
	case "parked":
		method, path = http.MethodGet, "/admin/parked"
	case "fill-gap":
		if fs.NArg() != 2 {
			fmt.Fprintf(stderr, "node fill-gap: want a correlation id and a key_seq\n")
			return 2
		}
		method, path = http.MethodPost, "/admin/keys/"+url.PathEscape(fs.Arg(0))+"/gaps/"+url.PathEscape(fs.Arg(1))+"/fill"
	case "purge":
		method, path = http.MethodPost, "/admin/purge"
	case "retry", "skip":
		bulk := *errSub != "" || *prefix != ""
		switch {
		case cmd == "retry" && bulk && *key == "" && fs.NArg() == 0:
			b, _ := json.Marshal(admin.Filter{ErrorContains: *errSub, KeyPrefix: *prefix})
			method, path, body = http.MethodPost, "/admin/retry", bytes.NewReader(b)
		case cmd == "retry" && *key != "" && fs.NArg() == 0 && !bulk:
			method, path = http.MethodPost, "/admin/keys/"+url.PathEscape(*key)+"/retry"
		case fs.NArg() == 1 && *key == "" && !bulk:
			method, path = http.MethodPost, "/admin/messages/"+url.PathEscape(fs.Arg(0))+"/"+cmd
		default:
			fmt.Fprintf(stderr, "node %s: give exactly one message id%s\n", cmd, map[bool]string{true: ", or -key, or -error and/or -key-prefix", false: ""}[cmd == "retry"])
			return 2
		}
	}
	if cmd != "retry" && cmd != "skip" && cmd != "gossip-key" && cmd != "fill-gap" && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "node %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}
	base := *addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	call := func(method, path string, body io.Reader) ([]byte, int) {
		req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+path, body)
		if err != nil {
			fmt.Fprintf(stderr, "node %s: %v\n", cmd, err)
			return nil, 2
		}
		if *token != "" {
			req.Header.Set("Authorization", "Bearer "+*token)
		}
		req.Header.Set(admin.OperatorHeader, *op)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			fmt.Fprintf(stderr, "node %s: %v\n", cmd, err)
			return nil, 1
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			var e struct{ Error string }
			if json.Unmarshal(answer, &e) != nil || e.Error == "" {
				e.Error = strings.TrimSpace(string(answer))
			}
			fmt.Fprintf(stderr, "node %s: %s (%s)\n", cmd, e.Error, resp.Status)
			return nil, 1
		}
		return answer, 0
	}
	answer, code := call(method, path, body)
	if code != 0 {
		return code
	}
	if cmd != "parked" {
		fmt.Fprintln(stdout, strings.TrimSpace(string(answer)))
		return 0
	}
	var list []admin.Parked
	if err := json.Unmarshal(answer, &list); err != nil {
		fmt.Fprintf(stderr, "node parked: decode: %v\n", err)
		return 1
	}
	printParked(stdout, list)
	answer, code = call(http.MethodGet, "/admin/gaps", nil)
	if code != 0 {
		return code
	}
	var gaps []admin.Gap
	if err := json.Unmarshal(answer, &gaps); err != nil {
		fmt.Fprintf(stderr, "node parked: decode gaps: %v\n", err)
		return 1
	}
	printGaps(stdout, gaps)
	return 0
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
