// Package pagetest holds the test of the node's cluster page in a real
// browser (headless Chromium through chromedp). It lives in the tools
// module (bench/go.mod), not next to cmd/node, so that chromedp stays out
// of the library module's go.mod: a program that imports only outbox and
// inbox does not get it in its module graph (docs/design.md, "Modules").
package pagetest
