package sources

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The sources scenario runs its outbox databases on PostgreSQL clusters of
// its own, made with Debian's pg_createcluster on this machine and
// dropped (pg_dropcluster --stop) when it ends, also after a failure or
// SIGINT (main turns SIGINT and SIGTERM into the scenario's context
// ending; the drop runs in a defer with a context of its own). A cluster
// is named srcClusterPrefix<bench pid>_<n>, so that a later run recognises
// the leftovers of a bench killed with SIGKILL (its pid no longer runs)
// and drops them, while a concurrent bench's clusters are left alone.

// srcClusterPrefix starts the name of every cluster the scenario makes.
const srcClusterPrefix = "ordo_bench_src_"

// pgClusterTimeout bounds each pg_createcluster, pg_ctlcluster and
// pg_dropcluster, and all of the drops at the end together.
const pgClusterTimeout = 2 * time.Minute

// pgTools are the Debian postgresql-common commands the scenario runs.
var pgTools = []string{"pg_createcluster", "pg_ctlcluster", "pg_dropcluster", "pg_lsclusters"}

// cmdRunner runs a command and returns its combined output; an error
// names the command and carries the output. Tests pass a fake.
type cmdRunner func(ctx context.Context, name string, args ...string) ([]byte, error)

// execRunner runs the command on this machine.
func execRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// checkPGTools refuses to run unless this process is root (pg_createcluster
// and the CPU cgroups need it) and every postgresql-common tool is on the
// PATH.
func checkPGTools(euid int, lookPath func(string) (string, error)) error {
	if euid != 0 {
		return fmt.Errorf("the sources scenario creates PostgreSQL clusters (pg_createcluster) and CPU cgroups: run it as root (effective uid is %d)", euid)
	}
	var missing []string
	for _, t := range pgTools {
		if _, err := lookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the sources scenario needs Debian's postgresql-common (%s not found on the PATH): apt-get install postgresql-common postgresql",
			strings.Join(missing, ", "))
	}
	return nil
}

// pgCluster is one cluster the scenario made.
type pgCluster struct {
	Name       string
	Port       int
	DataDir    string
	Postmaster int // the postmaster's pid, once started
}

// adminURL is the cluster's URL for creating databases.
func (c *pgCluster) adminURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// listedCluster is one line of pg_lsclusters.
type listedCluster struct {
	Version, Name, Status, DataDir string
	Port                           int
}

// parseLsClusters parses pg_lsclusters -h (no header): version, cluster,
// port, status, owner, data directory, log file. Lines it cannot read are
// skipped.
func parseLsClusters(out string) []listedCluster {
	var cs []listedCluster
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		port, err := strconv.Atoi(f[2])
		if err != nil {
			continue
		}
		cs = append(cs, listedCluster{Version: f[0], Name: f[1], Port: port, Status: f[3], DataDir: f[5]})
	}
	return cs
}

// leftoverOwner returns the pid in a cluster name of the scenario's
// (srcClusterPrefix<pid>_<n>), and false for any other name.
func leftoverOwner(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, srcClusterPrefix)
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "_")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// processAlive reports whether pid runs (signal 0 reaches it).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// pgClusters makes, starts and drops the scenario's clusters.
type pgClusters struct {
	run      cmdRunner
	version  string // PostgreSQL major version: 15
	owner    int    // this bench's pid, in the names
	alive    func(pid int) bool
	readFile func(string) ([]byte, error)
	made     []*pgCluster // created, not yet dropped
}

func newPGClusters(run cmdRunner, version string) *pgClusters {
	return &pgClusters{run: run, version: version, owner: os.Getpid(), alive: processAlive, readFile: os.ReadFile}
}

// list returns every cluster of the machine.
// pg_lsclusters fails while another process is halfway through
// pg_createcluster (the configuration exists, the data directory not
// yet), so a failure is tried again a few times.
func (s *pgClusters) list(ctx context.Context) ([]listedCluster, error) {
	var err error
	for range lsAttempts {
		var out []byte
		if out, err = s.run(ctx, "pg_lsclusters", "-h"); err == nil {
			return parseLsClusters(string(out)), nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(lsRetry):
		}
	}
	return nil, err
}

// lsAttempts and lsRetry are how often and how far apart list tries.
const (
	lsAttempts = 5
	lsRetry    = 500 * time.Millisecond
)

// removeLeftovers drops every cluster named like the scenario's whose
// bench no longer runs, and returns their names.
func (s *pgClusters) removeLeftovers(ctx context.Context) ([]string, error) {
	cs, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, c := range cs {
		pid, ok := leftoverOwner(c.Name)
		if !ok || (pid != s.owner && s.alive(pid)) {
			continue
		}
		if err := s.drop(ctx, c.Version, c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, c.Name)
	}
	return gone, errors.Join(errs...)
}

// create makes cluster number n on port, not started: trust for
// 127.0.0.1, listening there only, autovacuum off as on the shared
// server, started by hand only.
func (s *pgClusters) create(ctx context.Context, n, port, maxConns int) (*pgCluster, error) {
	c := &pgCluster{Name: fmt.Sprintf("%s%d_%d", srcClusterPrefix, s.owner, n), Port: port}
	cctx, cancel := context.WithTimeout(ctx, pgClusterTimeout)
	defer cancel()
	// The space keeps pg_createcluster from writing 127.0.0.1 unquoted
	// (it takes it for a number); PostgreSQL trims it.
	_, err := s.run(cctx, "pg_createcluster", s.version, c.Name, "-p", strconv.Itoa(port), "--start-conf", "manual",
		"-o", "listen_addresses= 127.0.0.1", "-o", "autovacuum=off", "-o", "max_connections="+strconv.Itoa(maxConns),
		"--", "--auth=trust")
	// Whatever part of it exists is dropped at the end, even on failure.
	s.made = append(s.made, c)
	if err != nil {
		return nil, err
	}
	cs, err := s.list(cctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(cs, func(l listedCluster) bool { return l.Version == s.version && l.Name == c.Name })
	if i < 0 {
		return nil, fmt.Errorf("pg_createcluster made no cluster %s/%s (pg_lsclusters does not list it)", s.version, c.Name)
	}
	c.DataDir = cs[i].DataDir
	return c, nil
}

// Start starts c with its postmaster inside the cgroup whose cgroup.procs
// file is procs: a shell writes its own pid there and then execs
// pg_ctlcluster, so the postmaster and every process it forks (each
// backend) are in the group from their first instruction. It checks that
// the postmaster is listed in procs.
func (s *pgClusters) Start(ctx context.Context, c *pgCluster, procs string) error {
	cctx, cancel := context.WithTimeout(ctx, pgClusterTimeout)
	defer cancel()
	if _, err := s.run(cctx, "sh", "-c", `echo $$ > "$0" && exec "$@"`, procs,
		"pg_ctlcluster", "--skip-systemctl-redirect", s.version, c.Name, "start"); err != nil {
		return err
	}
	b, err := s.readFile(filepath.Join(c.DataDir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if c.Postmaster, err = strconv.Atoi(strings.TrimSpace(first)); err != nil {
		return fmt.Errorf("cluster %s: postmaster.pid: %w", c.Name, err)
	}
	in, err := s.readFile(procs)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	if !slices.Contains(strings.Fields(string(in)), strconv.Itoa(c.Postmaster)) {
		return fmt.Errorf("cluster %s: its postmaster (pid %d) is not in the CPU cgroup %s", c.Name, c.Postmaster, procs)
	}
	return nil
}

// drop stops and removes one cluster.
func (s *pgClusters) drop(ctx context.Context, version, name string) error {
	_, err := s.run(ctx, "pg_dropcluster", "--stop", version, name)
	return err
}

// dropAll drops every cluster create made, within pgClusterTimeout,
// whether or not ctx has ended. It is idempotent.
func (s *pgClusters) dropAll() error {
	if len(s.made) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgClusterTimeout)
	defer cancel()
	// A cluster pg_createcluster failed to make is not listed: dropping
	// it would fail for nothing. Without a list, every one is tried.
	listed, lerr := s.list(ctx)
	var errs []error
	for _, c := range s.made {
		if lerr == nil && !slices.ContainsFunc(listed, func(l listedCluster) bool { return l.Version == s.version && l.Name == c.Name }) {
			continue
		}
		if err := s.drop(ctx, s.version, c.Name); err != nil {
			errs = append(errs, err)
		}
	}
	s.made = nil
	return errors.Join(errs...)
}
