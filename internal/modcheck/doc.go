// Package modcheck holds no code, only a test: a program that imports the
// library (outbox and inbox) must not get the tools' dependencies
// (gonum/plot for the bench's charts, chromedp for the cluster page's
// browser test) in its module graph. Those live in the tools module,
// bench/go.mod; docs/design.md, "Modules", says why. A second test loads
// the tools module alone (GOWORK=off), so that bench/go.sum cannot lose a
// checksum the workspace hides. A third checks the packages such a
// program links: outbox, inbox and relay bring the OpenTelemetry API but
// not its SDK, exporters or gRPC (the commands install those through
// internal/otelsetup), nor a test rig.
//
// The test needs only the go command and the module cache the repository's
// own build fills, not the servers.
package modcheck
