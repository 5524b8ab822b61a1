// Package childproc runs the project's own programs as child processes:
// Build compiles a main package once per process, Start runs a binary with
// its output kept line by line (and dying with its parent), and PickPort
// and PickAddr find free local ports for it. Tests use it through
// internal/testkit's testing.TB wrappers (BuildBinary, StartProcess,
// FreeAddr); cmd/demo and the bench use it directly. It links
// neither testing nor a test kit, so a command may use it.
package childproc
