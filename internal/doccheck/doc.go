// Package doccheck holds no code, only tests: they keep the repository's
// docs honest about the repository. Every path a doc names (README.md,
// docs/*.md, CHANGELOG.md) must exist, and the reference docs and the Go
// files state today's facts without pointing at the project's history: no
// "issue N", no commit hashes, no design notes kept outside the repository.
//
// The tests need only the go command and the source tree.
package doccheck
