// Package redact keeps secrets out of logs, HTTP answers and errors: it
// hides the password of a connection URL, even one that does not parse or
// that parses into something else than its author meant (a '#' or '@' in
// an unescaped password), where a parse error or url.URL.Redacted would
// still show it.
package redact

import "strings"

// Mask replaces a password.
const Mask = "xxxxx"

// URL returns rawURL with its password replaced by Mask. It works on the
// text, not on a parse: everything between the user name (up to the first
// ':' after "scheme://") and the last '@' is masked, so a password holding
// reserved characters is masked whole. A URL whose user part has no ':'
// (no password) is returned as it is; a string without "://" is masked
// entirely, since it may be nothing but a secret.
func URL(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return Mask
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return rawURL // no user part
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return rawURL
	}
	return scheme + "://" + user + ":" + Mask + rest[at:]
}
