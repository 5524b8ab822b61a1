package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/node"
)

// envPrefix prefixes the environment variable of every flag of "node":
// -confirm-window is also read from ORDO_CONFIRM_WINDOW (envflag.Name).
const envPrefix = "ORDO"

// options is the parsed command line of "node [flags]".
type options struct {
	node.Config
	// LogLevel is the lowest level logged.
	LogLevel slog.Level
	// LogFormat is json, text, or auto (json unless stderr, where logs go,
	// is a terminal).
	LogFormat string
	// SourcePartitions are the items of -source-partitions, NAME=COUNT
	// each, as given: parseConfig moves each count into the Sources entry
	// it names (sourcePartitions) once every flag and the environment are
	// read, since -source may come after it, or from the environment.
	SourcePartitions sourceCounts
	// SourceLayouts are the items of -source-layout, NAME=LAYOUT each,
	// moved into Sources by sourceLayouts as SourcePartitions are.
	SourceLayouts sourceCounts
	// TableDryRun prints what the node would publish from its adopted
	// tables (node.TableDryRun) and exits, instead of running the node.
	TableDryRun bool
}

// defaultOptions returns the defaults of every flag: node.DefaultConfig
// and the command's own.
func defaultOptions() options {
	return options{Config: node.DefaultConfig(), LogLevel: slog.LevelInfo, LogFormat: "auto"}
}

// nodeFlag is one flag of "node". Its environment variable is
// envflag.Name(envPrefix, name), and its default is what field holds in
// defaultOptions: neither is written here.
type nodeFlag struct {
	name string
	// field is the path of the field the flag sets, in options (node.Config's
	// fields are promoted): "Partitions", "Relay.Window".
	field string
	help  string
	// as, if set, makes the flag.Value for the field (a unit other than
	// the field's); nil picks one from the field's type.
	as func(field reflect.Value) flag.Value
	// env, if set, replaces the flag's environment variable
	// envflag.Name(envPrefix, name): -source, a repeatable flag, is read
	// from ORDO_SOURCES, a list.
	env string
}

// nodeFlags are the flags of "node", the public interface of the node
// (docker-compose.yml, deploy/ and README.md use them): add, never rename.
var nodeFlags = []nodeFlag{
	{name: "postgres-url", field: "PostgresURL", help: "PostgreSQL URL of the outbox database (the one-source form: the source named default)"},
	{name: "source", field: "Sources", env: "ORDO_SOURCES", help: "an outbox database to relay, NAME=POSTGRES_URL; repeat it for each (the environment takes space-separated pairs); replaces -postgres-url (name its database default)"},
	{name: "source-partitions", field: "SourcePartitions", help: "the partition count of one -source, NAME=COUNT; repeat it for each (the environment takes space-separated pairs); a source without one has -partitions; fixed at install"},
	{name: "amqp-url", field: "AMQP.URL", help: "RabbitMQ URL, or a comma-separated list of broker nodes tried in turn"},
	{name: "node-name", field: "NodeName", help: "this node's name (lease owner and gossip name); keep it stable across restarts"},
	{name: "http-addr", field: "HTTPAddr", help: "address for the cluster page, /healthz, /readyz, /status, /metrics and /admin"},
	{name: "partitions", field: "Partitions", help: "partition count P (of every source without -source-partitions); fixed at install"},
	{name: "db-max-conns", field: "DBMaxConns", help: "PostgreSQL pool size"},
	{name: "lease-ttl", field: "LeaseTTL", help: "partition lease lifetime; renewed every third of it"},
	{name: "admin-token", field: "AdminToken", help: "bearer token for the /admin actions (empty: actions off)"},
	{name: "pprof", field: "PProf", help: "serve Go's profiler under /debug/pprof/ on the HTTP address"},
	{name: "degraded-after", field: "DegradedAfter", help: "oldest pending age in this node's partitions above which /readyz and /status say degraded (0: off)"},
	{name: "table-layout", field: "TableLayout", help: "relay a table Ordo did not create instead of its own outbox: a layout preset, article (the article's EF Core \"OutboxMessages\"), and or key=column items separated by ; (schema, table, id, type, routing_key, payload, correlation_id, occurred_at, processed_at), e.g. 'article;table=outbox_messages'; docs/adopt.md"},
	{name: "source-layout", field: "SourceLayouts", help: "the table layout of one -source that relays a table Ordo did not create, NAME=LAYOUT (LAYOUT as -table-layout's, without spaces); repeat it for each (the environment takes space-separated pairs)"},
	{name: "table-dry-run", field: "TableDryRun", help: "print what the node would publish from its adopted tables (counts, keys, partitions, oldest pending age, bad rows, sampled keys' order) as JSON and exit; creates, publishes and marks nothing, so it can run beside the old relay"},
	{name: "table-exchange", field: "TableExchange", help: "the exchange an adopted table's messages go to (with -table-layout)"},
	{name: "table-poll-min", field: "TablePollMin", help: "the wait between two passes of an adopted table's intake while rows keep arriving: a row's latency against the intake's PostgreSQL work, which is mostly per pass"},
	{name: "table-poll-max", field: "TablePollMax", help: "the longest wait between two passes of an adopted table's intake, reached by doubling from -table-poll-min while no rows arrive"},
	{name: "table-probe-interval", field: "TableProbeInterval", help: "how often an adopted table's idle intake asks whether a new row is pending: a quiet table's latency against a round trip per interval; 0 turns it off"},
	{name: "backlog-interval", field: "BacklogInterval", help: "how often the backlog of every partition is read for /status and /metrics (one bounded query)"},

	{name: "confirm-window", field: "Relay.Window", help: "W: the most unconfirmed publishes in flight"},
	{name: "batch-size", field: "Relay.BatchSize", help: "most rows per partition per read"},
	{name: "read-ahead-mib", field: "Relay.ReadAheadBytes", as: mebibytes, help: "memory for rows read ahead of publishing or awaiting their mark, in MiB"},
	{name: "poll-interval", field: "Relay.PollInterval", help: "read this often without a notification"},
	{name: "settle-timeout", field: "Relay.SettleTimeout", help: "how long to wait for outstanding confirms when stopping"},
	{name: "retry-min", field: "Relay.RetryMin", help: "first backoff of a key whose message failed"},
	{name: "retry-max", field: "Relay.RetryMax", help: "backoff cap of a failing key"},
	{name: "max-attempts", field: "Relay.MaxAttempts", help: "failed attempts after which a message is parked"},
	{name: "retention-age", field: "Relay.RetentionAge", help: "delete processed rows older than this (0 keeps them)"},
	{name: "retention-interval", field: "Relay.RetentionInterval", help: "how often retention runs"},
	{name: "retention-chunk", field: "Relay.RetentionChunk", help: "most rows one retention DELETE removes"},

	{name: "confirm-timeout", field: "AMQP.ConfirmTimeout", help: "a publish unconfirmed this long on an open channel counts as a failed attempt"},
	{name: "cloudevents", field: "AMQP.CloudEvents", help: "publish every message as a CloudEvent too (AMQP binding, binary content mode: cloudEvents:* headers)"},
	{name: "cloudevents-source", field: "AMQP.CloudEventsSource", help: "the CloudEvents source attribute, a URI-reference such as /bookstore/orders; required with -cloudevents"},

	{name: "gossip-addr", field: "Gossip.BindAddr", help: "host:port for gossip (TCP and UDP); empty runs the node alone, owning every partition"},
	{name: "gossip-advertise", field: "Gossip.AdvertiseAddr", help: "host:port peers reach this node at (default: -gossip-addr)"},
	{name: "join", field: "Gossip.Join", help: "comma-separated seed gossip addresses"},
	{name: "gossip-key", field: "Gossip.Keys", help: "comma-separated base64 gossip encryption keys (16, 24 or 32 bytes); the first encrypts, all decrypt; required with -gossip-addr unless -gossip-insecure"},
	{name: "rejoin-interval", field: "Gossip.RejoinInterval", help: "how often to join the seeds again (heals splits)"},

	{name: "gossip-insecure", field: "Gossip.Insecure", help: "allow -gossip-addr without -gossip-key: gossip unencrypted (logged as a warning at every start)"},
	{name: "log-level", field: "LogLevel", as: levelFlag, help: "debug, info, warn or error"},
	{name: "log-format", field: "LogFormat", help: "json, text, or auto: json unless stderr is a terminal"},
}

// newNodeFlagSet returns the flag set of "node" writing into o, whose
// current values are the defaults shown. It panics on a table entry that
// names no field, or a field of a type it cannot parse (a test runs it).
func newNodeFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(out)
	root := reflect.ValueOf(o).Elem()
	for _, f := range nodeFlags {
		v := fieldByPath(root, f.field)
		if f.as != nil {
			fs.Var(f.as(v), f.name, f.help)
			continue
		}
		switch p := v.Addr().Interface().(type) {
		case *string:
			fs.StringVar(p, f.name, *p, f.help)
		case *int:
			fs.IntVar(p, f.name, *p, f.help)
		case *bool:
			fs.BoolVar(p, f.name, *p, f.help)
		case *time.Duration:
			fs.DurationVar(p, f.name, *p, f.help)
		case *[]string:
			fs.Var((*commaList)(p), f.name, f.help)
		case *[][]byte:
			fs.Var((*gossipKeys)(p), f.name, f.help)
		case *[]node.Source:
			fs.Var((*sourceList)(p), f.name, f.help)
		case *sourceCounts:
			fs.Var(p, f.name, f.help)
		default:
			panic(fmt.Sprintf("flag -%s: field %s has type %T, which has no flag type", f.name, f.field, p))
		}
	}
	fs.Usage = usage(fs, "usage: node [flags]\n       node status|health|parked|retry|skip|purge|fill-gap|gossip-key -h\n\nRuns one Ordo relay node.")
	return fs
}

// usage returns the usage of the flag set of "node": envflag.Usage's,
// with each flag's own environment variable (envOf).
func usage(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nFlags (each also read from the environment variable shown):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(w, "  -%s  (%s)\n    \t%s", f.Name, envOf(f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
}

// envOf returns the environment variable of the flag named name.
func envOf(name string) string {
	for _, f := range nodeFlags {
		if f.name == name && f.env != "" {
			return f.env
		}
	}
	return envflag.Name(envPrefix, name)
}

// envLookup returns lookup as envflag.Parse should ask it: the variable
// envflag names for a flag with its own (nodeFlag.env) is read from that
// one instead.
func envLookup(lookup func(string) (string, bool)) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for _, f := range nodeFlags {
			if f.env == "" {
				continue
			}
			if k == f.env {
				return "", false // only through its flag's name
			}
			if k == envflag.Name(envPrefix, f.name) {
				return lookup(f.env)
			}
		}
		return lookup(k)
	}
}

// fieldByPath returns the field of root at a dotted path; it panics if
// there is none.
func fieldByPath(root reflect.Value, path string) reflect.Value {
	v := root
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
		if !v.IsValid() {
			panic(fmt.Sprintf("no field %s in %s", path, root.Type()))
		}
	}
	return v
}

// flagOf returns the flag that sets the field at path, or "".
func flagOf(path string) string {
	for _, f := range nodeFlags {
		if f.field == path {
			return f.name
		}
	}
	return ""
}

// parseConfig parses the command line of "node" (flags, then the
// environment through lookup, then defaults) and checks the result,
// reporting every problem at once. Usage goes to out.
func parseConfig(args []string, lookup func(string) (string, bool), out io.Writer) (options, error) {
	o := defaultOptions()
	fs := newNodeFlagSet(&o, out)
	if err := envflag.Parse(fs, envPrefix, args, envLookup(lookup)); err != nil {
		return o, err
	}
	var errs problemList
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	if err := checkOneSourceForm(fs, lookup); err != nil {
		errs = append(errs, err)
	}
	if err := checkLogFormat(o.LogFormat); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, sourcePartitions(&o)...)
	errs = append(errs, sourceLayouts(&o)...)
	errs = append(errs, flagProblems(o.Validate())...)
	if len(errs) > 0 {
		return o, errs
	}
	return o, nil
}

// problemList is every problem of a command line, printed one a line
// after their count when there are several.
type problemList []error

func (l problemList) Error() string {
	if len(l) == 1 {
		return l[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems:", len(l))
	for _, e := range l {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

func (l problemList) Unwrap() []error { return l }

// flagProblems rewrites the problems of a node.Config as flag problems:
// "Relay.Window: 0 is out of range" becomes "-confirm-window
// (ORDO_CONFIRM_WINDOW): 0 is out of range", and a field a message names
// becomes its flag ("needs a gossip address (-gossip-addr)"). A problem
// of a field no flag sets is kept as it is.
func flagProblems(err error) []error {
	var errs []error
	for _, p := range confcheck.Problems(err) {
		if name := flagOf(p.Field); name != "" {
			errs = append(errs, fmt.Errorf("-%s (%s): %s", name, envOf(name), flagNames(p.Msg)))
		} else {
			errs = append(errs, p)
		}
	}
	if len(errs) == 0 && err != nil {
		errs = append(errs, err) // not a Problem: cannot happen, but never drop one
	}
	return errs
}

// fieldPath matches what may be a field path in a message: "LeaseTTL",
// "Gossip.Insecure".
var fieldPath = regexp.MustCompile(`\b[A-Z][A-Za-z]*(\.[A-Z][A-Za-z]*)*\b`)

// flagNames replaces in msg every field path a flag sets with the flag.
func flagNames(msg string) string {
	return fieldPath.ReplaceAllStringFunc(msg, func(path string) string {
		if name := flagOf(path); name != "" {
			return "-" + name
		}
		return path
	})
}

// commaList is a flag.Value of comma-separated items, spaces trimmed and
// empty items dropped.
type commaList []string

func (l *commaList) String() string { return strings.Join(*l, ",") }

func (l *commaList) Set(s string) error {
	*l = nil
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l = append(*l, item)
		}
	}
	return nil
}

// checkOneSourceForm refuses -postgres-url together with -source (from
// the command line or the environment): which database would be the
// source named default is not for the node to guess.
func checkOneSourceForm(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	isSet := func(name string) bool {
		_, env := lookup(envOf(name))
		return set[name] || env
	}
	if isSet("postgres-url") && isSet("source") {
		return fmt.Errorf("-postgres-url (%s) and -source (%s) are both set: -source replaces -postgres-url; list that database as -source default=URL",
			envOf("postgres-url"), envOf("source"))
	}
	return nil
}

// sourceList is a flag.Value of outbox databases, NAME=URL each: every
// Set appends the space-separated pairs it is given (a repeated flag, or
// the environment's list). String shows the names only: URLs may hold
// passwords.
type sourceList []node.Source

func (l *sourceList) String() string {
	names := make([]string, len(*l))
	for i, s := range *l {
		names[i] = s.Name
	}
	return strings.Join(names, " ")
}

func (l *sourceList) Set(v string) error {
	for _, pair := range strings.Fields(v) {
		// An item that is not NAME=URL becomes a source without a name,
		// which node.Config.Validate reports: an error from Set would be
		// printed by the flag package with the item, which may be a URL
		// with a password.
		name, url, _ := strings.Cut(pair, "=")
		if url == "" {
			name = ""
		}
		*l = append(*l, node.Source{Name: name, PostgresURL: url})
	}
	return nil
}

// gossipKeys is a flag.Value of comma-separated base64 gossip keys. It
// never prints them: String shows how many there are.
type gossipKeys [][]byte

func (k *gossipKeys) String() string {
	if len(*k) == 0 {
		return ""
	}
	return fmt.Sprintf("(%d keys)", len(*k))
}

func (k *gossipKeys) Set(s string) error {
	keys, err := membership.ParseKeys(s)
	*k = keys
	return err
}

// levelFlag makes a slog.Level field a flag shown in lower case.
func levelFlag(field reflect.Value) flag.Value {
	return (*level)(field.Addr().Interface().(*slog.Level))
}

// level is a slog.Level set by name (debug, info, warn, error).
type level slog.Level

func (l *level) String() string     { return strings.ToLower(slog.Level(*l).String()) }
func (l *level) Set(s string) error { return (*slog.Level)(l).UnmarshalText([]byte(s)) }

// mebibytes makes an int64 field of bytes a flag counted in MiB.
func mebibytes(field reflect.Value) flag.Value {
	return (*mib)(field.Addr().Interface().(*int64))
}

// mib is a byte count set and shown in MiB.
type mib int64

func (m *mib) String() string { return strconv.FormatInt(int64(*m)>>20, 10) }

func (m *mib) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return errors.New("not a whole number of MiB")
	case n < 0 || n > 1<<40:
		return fmt.Errorf("%d MiB is out of range 0..%d", n, int64(1)<<40)
	}
	*m = mib(n << 20)
	return nil
}
