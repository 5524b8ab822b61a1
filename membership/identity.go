package membership

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ordo-relay/ordo/wire"
)

// A source's database identity travels in the node's metadata as a short
// token (DatabaseIdentity), so that the nodes of a cluster can tell
// whether they relay the same database under a source's name: two nodes
// whose "orders" are two databases lease in two ordo_leases tables, and
// the partitions one of them is given are never leased in the other's
// database; two nodes relaying one database under two names publish its
// rows under either name. See Conflict.

// IdentityLen is the length of an identity token (DatabaseIdentity): 8
// base64url characters, 48 bits of a SHA-256.
const IdentityLen = 8

// MinIdentityLen is the shortest token compared. Metadata too long for
// memberlist's 512 bytes gossips shorter tokens (encodeMeta), down to
// this; peers compare the tokens' common prefix.
const MinIdentityLen = 4

// unknownByte fills the token of a source whose identity is unknown (its
// role may not read the server's control data) or not checked against
// the cluster yet. It is not a base64url character.
const unknownByte = '.'

// DatabaseIdentity returns the identity token of a database: the first
// 48 bits of the SHA-256 of the server's system identifier and the
// database's oid, base64url (IdentityLen characters). It is the same
// whatever URL, host name or port reaches the database, and the same on a
// physical standby promoted in its place.
func DatabaseIdentity(systemID uint64, dbOID uint32) string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], systemID)
	binary.BigEndian.PutUint32(b[8:], dbOID)
	sum := sha256.Sum256(b[:])
	return base64.RawURLEncoding.EncodeToString(sum[:6])
}

// sourceID is one source a member lists, with its identity token ("" when
// it gossips none).
type sourceID struct {
	name, id string
}

// listed returns the names of the sources h lists, in order: Sources'
// fields without their "!", or wire.DefaultSource alone when it lists
// none.
func (h Health) listed() []string {
	if h.Sources == "" {
		return []string{wire.DefaultSource}
	}
	names := strings.Fields(h.Sources)
	for i, n := range names {
		names[i] = strings.TrimPrefix(n, "!")
	}
	return names
}

// identities returns the sources h lists, each with its token. IDs
// holds one token per listed source, all of one width; IDs of another
// length (a member older than identities sends none) leaves every token
// unknown.
func (h Health) identities() []sourceID {
	names := h.listed()
	out := make([]sourceID, len(names))
	w := 0
	if len(h.IDs)%len(names) == 0 {
		w = len(h.IDs) / len(names)
	}
	for i, n := range names {
		out[i].name = n
		if w >= MinIdentityLen {
			if id := h.IDs[i*w : (i+1)*w]; !strings.ContainsRune(id, unknownByte) {
				out[i].id = id
			}
		}
	}
	return out
}

// Identity returns the identity token the member gossips for source, ""
// when it gossips none for it (or does not relay it).
func (h Health) Identity(source string) string {
	for _, s := range h.identities() {
		if s.name == source {
			return s.id
		}
	}
	return ""
}

// unknownID is the token of a source whose identity is unknown.
func unknownID() string { return strings.Repeat(string(unknownByte), IdentityLen) }

// sameDatabase reports whether two known tokens name one database: their
// common prefix is equal.
func sameDatabase(a, b string) bool {
	n := min(len(a), len(b))
	return a[:n] == b[:n]
}

// fitIDs returns h with its identity tokens cut to the widest that keeps
// the metadata within limit bytes whatever the sources' reachability (the
// "!" of each, Broker and Database false): the width is the same while the
// listed sources are. IDs is dropped when not even MinIdentityLen fits.
func fitIDs(h Health, limit int) Health {
	if h.IDs == "" {
		return h
	}
	n := len(h.listed())
	if len(h.IDs)%n != 0 {
		h.IDs = ""
		return h
	}
	w := len(h.IDs) / n
	worst := Health{Sources: h.Sources}
	if h.Sources != "" {
		worst.Sources = "!" + strings.Join(h.listed(), " !")
	}
	b, _ := json.Marshal(nodeMeta{V: metaVersion, Health: worst}) // cannot fail
	room := (limit - len(b) - len(`,"id":""`)) / n
	if room < MinIdentityLen {
		h.IDs = ""
		return h
	}
	if room >= w {
		return h
	}
	var ids strings.Builder
	for i := range n {
		ids.WriteString(h.IDs[i*w : i*w+room])
	}
	h.IDs = ids.String()
	return h
}

// Conflict is a peer that disagrees with this node about a source's
// database: it relays the source from another database (PeerSource is
// Source), or the source's database under another name (PeerSource is
// not Source). Identities are the tokens gossiped (DatabaseIdentity).
type Conflict struct {
	Source       string `json:"source"`       // this node's source
	Identity     string `json:"identity"`     // its database's token, as this node gossips it
	Peer         string `json:"peer"`         // the peer's node name
	PeerSource   string `json:"peerSource"`   // the peer's source
	PeerIdentity string `json:"peerIdentity"` // its token, as the peer gossips it
}

// String says what is wrong, naming both sides.
func (c Conflict) String() string {
	if c.PeerSource == c.Source {
		return fmt.Sprintf("source %s: node %s relays it from another database (its identity %s, this node's %s)",
			c.Source, c.Peer, c.PeerIdentity, c.Identity)
	}
	return fmt.Sprintf("source %s: node %s relays the same database (identity %s) as its source %s",
		c.Source, c.Peer, c.Identity, c.PeerSource)
}

// findConflicts returns every conflict between the sources self lists
// (with a known identity) and those the peers list (with one), ordered by
// peer, then source. A source or a peer whose identity is unknown (not
// checked yet, unreadable, or a node older than identities) conflicts
// with nothing.
func findConflicts(self Health, peers map[string]Health) []Conflict {
	var out []Conflict
	mine := self.identities()
	for _, peer := range slices.Sorted(maps.Keys(peers)) {
		theirs := peers[peer].identities()
		for _, s := range mine {
			if s.id == "" {
				continue
			}
			for _, t := range theirs {
				// Same name and another database, or another name and
				// the same database.
				if t.id != "" && (t.name == s.name) != sameDatabase(s.id, t.id) {
					out = append(out, Conflict{Source: s.name, Identity: s.id, Peer: peer, PeerSource: t.name, PeerIdentity: t.id})
				}
			}
		}
	}
	return out
}

// agrees reports whether a peer lists source with the same database as
// id, a known token.
func agrees(peers map[string]Health, source, id string) bool {
	for _, h := range peers {
		for _, t := range h.identities() {
			if t.name == source && t.id != "" && sameDatabase(t.id, id) {
				return true
			}
		}
	}
	return false
}

// ErrIdentityConflict is wrapped by the *ConflictError that Run returns
// when a source of this node, checked against the cluster's as it joins
// (or as the source's database first answers), conflicts with a peer's.
var ErrIdentityConflict = errors.New("the cluster disagrees on a source's database")

// ConflictError lists the conflicts that stopped this node from joining
// with a source. It unwraps to ErrIdentityConflict.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	parts := make([]string, len(e.Conflicts))
	for i, c := range e.Conflicts {
		parts[i] = c.String()
	}
	return fmt.Sprintf("%s; every node must reach one database under one name (check -source / ORDO_SOURCES and -postgres-url on each node): %v",
		strings.Join(parts, "; "), ErrIdentityConflict)
}

func (e *ConflictError) Unwrap() error { return ErrIdentityConflict }
