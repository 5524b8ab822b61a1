package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/wire"
)

// nodeURL is path on a node's HTTP address, given as host:port or as a URL.
func nodeURL(addr, path string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimSuffix(addr, "/") + path
}

// statusCmd is "node status": it fetches a node's /status and prints it
// as tables for people.
func statusCmd(ctx context.Context, c cli, _ string, args []string) error {
	fs := flag.NewFlagSet("node status", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	addr := fs.String("http", "127.0.0.1:8081", "the node's HTTP address (host:port or URL)")
	fs.Usage = envflag.Usage(fs, "ORDO_STATUS", "usage: node status [-http ADDR]\n\nPrints a node's view of the cluster.")
	if err := envflag.Parse(fs, "ORDO_STATUS", args, c.lookup); err != nil {
		return usageError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodeURL(*addr, "/status"), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s answered %s: %s", nodeURL(*addr, "/status"), resp.Status, strings.TrimSpace(string(b)))
	}
	var st node.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	printStatus(c.stdout, st)
	return nil
}

func printStatus(w io.Writer, st node.Status) {
	sources := st.Sources
	oneSource := len(sources) <= 1 && (len(sources) == 0 || sources[0].Name == wire.DefaultSource)
	if oneSource {
		sources = []node.SourceStatus{{Name: wire.DefaultSource, Reachable: true, Partitions: st.Partitions,
			Held: st.Held, Assignment: st.Assignment, Leases: st.Leases, Relay: st.Relay}}
	}
	held, total := 0, 0 // each source has its own count
	for _, s := range sources {
		held, total = held+len(s.Held), total+s.Partitions
	}
	fmt.Fprintf(w, "node %s: %d of %d partitions held, broker connected: %v\n", st.Node, held, total, st.Broker)
	fmt.Fprintf(w, "relay: published %d, marked %d, failed %d, refused %d, in flight %d\n\n",
		st.Relay.Published, st.Relay.Marked, st.Relay.Failed, st.Relay.Refused, st.Relay.InFlight)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tADDRESS\tSTATE\tASSIGNED")
	assigned := map[string]int{}
	for _, s := range sources {
		for _, o := range s.Assignment {
			assigned[o]++
		}
	}
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", m.Name, m.Addr, m.State, assigned[m.Name])
	}
	tw.Flush()
	for _, s := range sources {
		fmt.Fprintln(w)
		if !oneSource {
			state := "reachable"
			if !s.Reachable {
				state = "UNREACHABLE from this node"
			}
			fmt.Fprintf(w, "source %s (%s): %d of %d partitions held, relay published %d, marked %d, in flight %d\n",
				s.Name, state, len(s.Held), s.Partitions, s.Relay.Published, s.Relay.Marked, s.Relay.InFlight)
		}
		printPartitions(w, s)
	}
}

// printPartitions prints the partition table of one source.
func printPartitions(w io.Writer, s node.SourceStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PARTITION\tASSIGNED TO\tLEASE OWNER\tEPOCH\tPENDING\tOLDEST (s)\t")
	for _, p := range s.Leases {
		a := ""
		if p.Partition < len(s.Assignment) {
			a = s.Assignment[p.Partition]
		}
		owner := p.Owner
		if owner == "" {
			owner = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%.1f\t\n", p.Partition, a, owner, p.Epoch, p.Pending, p.OldestPendingSeconds)
	}
	tw.Flush()
}
