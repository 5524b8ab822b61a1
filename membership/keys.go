package membership

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrNoEncryption is returned by RotateKey on a node started without
// gossip keys: encryption cannot be switched on while running, because
// the node's peers would stop understanding it.
var ErrNoEncryption = errors.New("gossip encryption is off on this node: it was started without -gossip-key")

// KeyAction is one step of a key rotation.
type KeyAction string

// The steps of a rotation, each done on every node before the next:
// add the new key (all nodes now decrypt it), use it (all encrypt with it),
// remove the old one.
const (
	KeyAdd    KeyAction = "add"
	KeyUse    KeyAction = "use"
	KeyRemove KeyAction = "remove"
)

// RotateKey applies one rotation step to this node's keyring, while it
// runs. Safe for concurrent use.
func (m *Membership) RotateKey(action KeyAction, key []byte) error {
	kr := m.keyring
	if kr == nil {
		return ErrNoEncryption
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return fmt.Errorf("gossip key: %d bytes; want 16, 24 or 32", n)
	}
	var err error
	switch action {
	case KeyAdd:
		err = kr.AddKey(key)
	case KeyUse:
		if !m.hasKey(key) {
			return errors.New("gossip key: add the key (on every node) before using it")
		}
		err = kr.UseKey(key)
	case KeyRemove:
		if bytes.Equal(kr.GetPrimaryKey(), key) {
			return errors.New("gossip key: the key in use cannot be removed; use another one first")
		}
		err = kr.RemoveKey(key)
	default:
		return fmt.Errorf("gossip key: unknown action %q (want add, use or remove)", action)
	}
	if err != nil {
		return fmt.Errorf("gossip key %s: %w", action, err)
	}
	m.cfg.Logger.Info("gossip key rotated", "action", string(action), "keys", len(kr.GetKeys()))
	return nil
}

// KeyCount returns how many gossip keys this node holds (0: no encryption).
func (m *Membership) KeyCount() int {
	if kr := m.keyring; kr != nil {
		return len(kr.GetKeys())
	}
	return 0
}

func (m *Membership) hasKey(key []byte) bool {
	for _, k := range m.keyring.GetKeys() {
		if bytes.Equal(k, key) {
			return true
		}
	}
	return false
}
