// Package doccheck holds no code, only tests: they keep the repository's
// docs honest about the repository.
//
//   - Every path a doc (README.md, docs/*.md) names exists, and every link
//     (CHANGELOG.md's too) leads to a file, and to a heading of it when it
//     names one (#anchor).
//   - The reference docs (every doc but CHANGELOG.md) and the Go files state
//     today's facts without pointing at the project's history: no "issue
//     N", no commit hashes, no design notes kept outside the repository.
//     The history goes in CHANGELOG.md.
//   - docs/design.md has no paragraph over 25 lines.
//
// The tests need only the go command and the source tree.
package doccheck
